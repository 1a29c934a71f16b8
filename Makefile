# The two commands that matter: `make demo` (a local fleet with the whole system) and `make test`
# (everything CI runs). Both build what they need on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
FLEET_DIR ?= .fleet

.PHONY: help test demo lint fmt-check clippy crd-check catalog-check crds control-plane system-deps rules-test

help:
	@echo "make demo   - start a local fleet (master, 2 seeds, 3 user clusters) with the quota system"
	@echo "              (CHART_RBAC=1: every component as its ServiceAccount from the Helm chart)"
	@echo "              (NODE=1: seed-a's components as pods from the chart on a real node; root)"
	@echo "make test   - everything CI runs: fmt, clippy, CRD drift, unit, property and fleet tests"
	@echo "make crds   - regenerate deploy/crds/ from the Rust types"
	@echo "make bench  - every benchmark, one after another, into results/benchmarks.md (long: see e2e/bench.sh)"

# Debian packages the tests need (promtool for the alert rule tests).
system-deps:
	@bash .ci/system-deps.sh

# kube-apiserver + etcd from their Go modules, cached under ~/.cache/kkp-quota (or $$KUBEBUILDER_ASSETS).
control-plane:
	@e2e/control-plane/build.sh >/dev/null

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

crd-check:
	$(CARGO) run -q --locked -p kkp-quota-crds --bin crdgen -- --check

crds:
	$(CARGO) run -q -p kkp-quota-crds --bin crdgen

# The shipped size catalogs against the flavour CSVs they were generated from. Those live in the
# team's shared folder beside the checkout; a checkout without it says so and checks nothing here
# (the catalogs' own tests still run).
CATALOG_SOURCES ?= ../shared/catalog-sources
catalog-check:
	@if [ -d "$(CATALOG_SOURCES)" ]; then \
		python3 provider-sizes/catalog/generate.py --check --sources "$(CATALOG_SOURCES)" && echo "catalog-check: shipped catalogs match $(CATALOG_SOURCES)"; \
	else \
		echo "catalog-check: $(CATALOG_SOURCES) is not here; shipped catalogs not compared with their sources"; \
	fi

lint: fmt-check clippy crd-check catalog-check

# Alert rules: syntax, and promtool unit tests (series that fire each alert and series that must not).
rules-test: system-deps
	promtool check rules deploy/prometheus/kkp-quota.rules.yaml
	cd deploy/prometheus && promtool test rules kkp-quota.rules.test.yaml
	deploy/prometheus/gen-prometheusrule.sh --check
	deploy/check-metric-names.sh

# The Helm chart: copies in sync with deploy/, helm lint and template for both roles, and wrong
# values refused (helm built from its Go module by e2e/helm/build.sh, cached).
.PHONY: chart-check
chart-check:
	deploy/charts/check.sh

test: system-deps control-plane lint rules-test chart-check
	KUBEBUILDER_ASSETS="$$(e2e/control-plane/build.sh)" CARGO=$(CARGO) e2e/test-all.sh

demo: control-plane $(if $(NODE),system-deps)
	$(CARGO) build --locked --bins -p e2e -p master-controller -p seed-controller -p machine-webhook -p kubectl-kkp-quota
	KUBEBUILDER_ASSETS="$$(e2e/control-plane/build.sh)" $(CARGO) run --locked -p e2e --bin fleet -- --dir $(FLEET_DIR) $(if $(CHART_RBAC),--chart-rbac) $(if $(NODE),--node)

# Container images without a daemon or base image: target/images/kkp-quota-<component>.oci.tar (umoci).
.PHONY: images
images: system-deps
	deploy/images/build.sh

# Every benchmark in release, one after another (never two at once), into results/benchmarks.md.
.PHONY: bench
bench: control-plane
	e2e/bench.sh
