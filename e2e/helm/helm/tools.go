//go:build tools

// Package tools pins the helm command as a dependency of this wrapper module.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
