//go:build tools

// Package tools pins the control-plane commands the local fleet runs as dependencies of this
// wrapper module: kube-apiserver, and kube-controller-manager (garbage collector and namespace
// controller, so that owner cascades happen as in a real cluster); kubelet, kube-scheduler and
// kube-proxy for the optional node that runs the chart as pods (e2e/node); kubectl, whose real
// output (warnings, dry runs) the tests read.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
