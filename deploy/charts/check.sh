#!/usr/bin/env bash
# Checks the kkp-quota chart without a cluster (`make chart-check`, part of `make test`):
#   1. the chart's copies of the CRDs and alert rules match deploy/ (sync-files.sh --check);
#   2. `helm lint --strict` and `helm template` pass for role=master and role=seed, and for the
#      non-default paths (cert-manager, own issuer, monitoring on, json logs, one replica without
#      leader election, no NetworkPolicy, no CRDs);
#   3. the object names and component labels other tests rely on are rendered;
#   4. wrong values are refused, each for the expected reason.
# helm comes from e2e/helm/build.sh (cached; KKP_QUOTA_HELM=/path/to/helm to use your own).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
chart="$here/kkp-quota"
helm=$("$root/e2e/helm/build.sh")
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

"$here/sync-files.sh" --check || fail "chart files differ from deploy/ (run deploy/charts/sync-files.sh)"

render() { # helm template with the release name and namespace of the README
  "$helm" template kkp-quota "$chart" --namespace kubermatic "$@"
}

positive=(
  "role=master"
  "role=seed"
  "role=master,logFormat=json,serviceMonitor.enabled=true,prometheusRule.enabled=true,crds.install=false"
  "role=master,masterController.allocationWebhook.enabled=false"
  "role=master,masterController.leaderElection.enabled=false,masterController.replicas=1,masterController.seedKubeconfigSecret=kkp-quota-seed-{seed},masterController.goneSeeds={seed-b,seed-c},masterController.drainingSeeds={seed-d}"
  "role=seed,machineWebhook.certificate.source=cert-manager,serviceMonitor.enabled=true,prometheusRule.enabled=true"
  "role=seed,machineWebhook.certificate.source=cert-manager,machineWebhook.certificate.certManager.issuerRef.name=my-ca,machineWebhook.certificate.certManager.issuerRef.kind=ClusterIssuer"
  "role=seed,machineWebhook.networkPolicy.enabled=false,seedController.leaderElection.enabled=false,seedController.replicas=1,seedController.webhookUrl=https://quota-webhook.example.com,seedController.webhookOperations=create"
  "role=seed,urlSigningKeys[0]=$(printf 'k%.0s' {1..32} | base64),image.registry=registry.example.com/kkp-quota,image.tag=dev"
)
for set in "${positive[@]}"; do
  out=$("$helm" lint --strict "$chart" --namespace kubermatic --set "$set" 2>&1) || fail "helm lint --strict --set $set: $out"
  render --set "$set" >/dev/null || fail "helm template --set $set"
done

# The names and labels the RBAC tests and the docs rely on.
expect() { # role, then "Kind/name" strings that must be rendered
  local role=$1 manifest
  shift
  manifest=$(render --set "role=$role" | awk '
    /^---/ { kind = ""; name = ""; meta = 0; next }
    /^kind: / { kind = $2 }
    /^metadata:/ { meta = 1; next }
    /^[^ ]/ { meta = 0 }
    meta && /^  name: / && name == "" { name = $2; print kind "/" name }')
  for want in "$@"; do
    grep -qxF "$want" <<<"$manifest" || fail "role=$role does not render $want"
  done
}
expect master ServiceAccount/kkp-quota-master-controller Deployment/kkp-quota-master-controller \
  ClusterRole/kkp-quota-master-controller CustomResourceDefinition/projectquotas.kkp-quota.dev \
  CustomResourceDefinition/quotagroups.kkp-quota.dev ClusterRole/kkp-quota-group-owner \
  Service/kkp-quota-master-controller-webhook Secret/kkp-quota-allocation-webhook-tls \
  ValidatingWebhookConfiguration/kkp-quota-allocation
expect seed ServiceAccount/kkp-quota-seed-controller ServiceAccount/kkp-quota-machine-webhook \
  ServiceAccount/kkp-quota-master Deployment/kkp-quota-seed-controller Deployment/kkp-quota-machine-webhook \
  ClusterRole/kkp-quota-master Service/kkp-quota-machine-webhook Secret/kkp-quota-webhook-tls \
  Secret/kkp-quota-url-signing-keys CustomResourceDefinition/quotaledgers.kkp-quota.dev \
  ValidatingWebhookConfiguration/kkp-quota-clusters
for role in master seed; do
  # Every RBAC object carries app.kubernetes.io/component of one of the four identities, or
  # group-owner (the ClusterRole for QuotaGroup owners, bound by admins).
  unlabelled=$(render --set "role=$role" | awk '
    /^---/ { if (rbac && !ok) print kind "/" name; rbac = 0; ok = 0; kind = ""; name = ""; next }
    /^kind: (ServiceAccount|ClusterRole|ClusterRoleBinding|Role|RoleBinding)$/ { rbac = 1; kind = $2 }
    /^  name: / && name == "" { name = $2 }
    /^    app.kubernetes.io\/component: (master-controller|seed-controller|machine-webhook|master-on-seed|group-owner)$/ { ok = 1 }
    END { if (rbac && !ok) print kind "/" name }')
  [[ -z "$unlabelled" ]] || fail "role=$role: RBAC objects without a component label: $unlabelled"
done

# Values that must be refused: "--set" arguments, then a word the error must contain.
negative=(
  "logFormat=text|role"
  "role=bogus|role"
  "role=master,bogus=1|bogus"
  "role=master,masterController.replicas=-1|replicas"
  "role=seed,machineWebhook.replicas=-1|replicas"
  "role=master,logFormat=xml|logFormat"
  "role=master,masterController.shareSlackPercent=101|shareSlackPercent"
  "role=master,masterController.seedKubeconfigSecret=kkp-quota-seed|seedKubeconfigSecret"
  "role=master,masterController.goneSeeds[0]=Seed_B|goneSeeds"
  "role=master,masterController.drainingSeeds[0]=Seed_D|drainingSeeds"
  "role=seed,seedController.resyncPeriod=soon|resyncPeriod"
  "role=seed,seedController.webhookOperations=update|webhookOperations"
  "role=seed,machineWebhook.certificate.source=vault|source"
  "role=seed,seedController.unknownFlag=1|unknownFlag"
  "role=seed,urlSigningKeys[0]=c2hvcnQ=|urlSigningKeys"
  "role=master,masterController.leaderElection.enabled=false|leader election"
)
for case in "${negative[@]}"; do
  set=${case%|*} reason=${case##*|}
  if out=$(render --set "$set" 2>&1 >/dev/null); then
    fail "helm template --set $set succeeded; it must fail ($reason)"
  elif ! grep -qiF -- "$reason" <<<"$out"; then
    fail "helm template --set $set failed, but not because of $reason: $out"
  fi
done
# No role at all (values.yaml has none).
if out=$(render 2>&1 >/dev/null); then
  fail "helm template without role succeeded"
elif ! grep -qi "role" <<<"$out"; then
  fail "helm template without role failed, but not because of role: $out"
fi

if ((failures)); then
  echo "chart-check: $failures failure(s)" >&2
  exit 1
fi
echo "chart-check: ok (${#positive[@]} value sets linted and rendered, $((${#negative[@]} + 1)) wrong ones refused)" >&2
