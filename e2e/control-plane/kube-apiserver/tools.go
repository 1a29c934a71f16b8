//go:build tools

// Package tools pins the kube-apiserver command as a dependency of this wrapper module.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
