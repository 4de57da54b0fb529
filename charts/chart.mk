# Makefile fragment for the Helm chart charts/tessera; the root Makefile
# includes it. $(CURDIR) is the repository root, $(TOOLS) its bin/tools.
#
# Targets:
#   helm          build bin/tools/helm from hack/tools/go.mod's helm.sh/helm/v3
#   chart         lint, render every variant, package into bin/charts/
#   deploy        render deploy/ from the chart (charts/deploy-values.yaml)
#   deploy-check  fail when deploy/ is not what the chart renders
#   chart-test    chart + deploy-check + vet of hack/tools (part of make test)
#
# The server-side check (every rendered object dry-run applied to a real
# kube-apiserver) is test/chart, run by make test-integration.

HELM_TOOLS_DIR      := $(CURDIR)/hack/tools
HELM                := $(TOOLS)/helm
DEPLOYGEN           := $(TOOLS)/deploygen
CHART_DIR           := charts/tessera
CHART_DEPLOY_VALUES := charts/deploy-values.yaml
# lint and template against the Kubernetes version the test cluster runs.
CHART_KUBE_VERSION  ?= v1.34.2
# Each line: the --set flags of one variant that chart-lint and
# chart-template render besides the defaults.
CHART_VARIANTS := \
	scheduler.mode=configmap \
	scheduler.mode=none,extender.tls.mode=none,extender.webhooks.enabled=false \
	extender.tls.mode=secret,extender.tls.secretName=my-tls,extender.tls.caBundle=Q0E=,extender.namespace=kube-system \
	extender.metricsPort=9090,extender.service.clusterIP=10.96.0.50,scheduler.extenderURL=https://10.96.0.50:8888,namespace.create=true \
	scheduler.mode=plugin \
	extender.tls.mode=secret,extender.tls.secretName=my-tls,extender.tls.caBundle=Q0E=,extender.tls.clientSecretName=my-scheduler-client \
	scheduler.mode=configmap,extender.tls.verbAuth=false \
	scheduler.mode=plugin,extender.tls.mode=none,extender.metricsPort=9090,extender.namespace=kube-system,extender.webhooks.nvidiaGPU=true

.PHONY: helm chart chart-lint chart-template deploy deploy-check chart-test

# go build reuses the compile cache that `go tool helm` (test/chart) fills;
# the ldflags set helm's version and its default Kubernetes version (that
# of the client-go it is built with), as helm's own Makefile does.
$(HELM): hack/tools/go.mod hack/tools/go.sum
	@mkdir -p $(TOOLS)
	cd $(HELM_TOOLS_DIR) && \
		v=$$($(GO) list -m -f '{{.Version}}' helm.sh/helm/v3) && \
		minor=$$($(GO) list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2) && \
		$(GO) build -ldflags "-X helm.sh/helm/v3/internal/version.version=$$v \
			-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$$minor \
			-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$$minor" \
			-o $@.tmp helm.sh/helm/v3/cmd/helm
	mv $@.tmp $@
	@$@ version --short

helm: $(HELM) ## build bin/tools/helm (helm.sh/helm/v3, version pinned in hack/tools/go.mod)

chart-lint: $(HELM) ## helm lint --strict of charts/tessera, defaults and every variant
	$(HELM) lint --strict --kube-version $(CHART_KUBE_VERSION) $(CHART_DIR)
	@for v in $(CHART_VARIANTS); do \
		echo "helm lint --set $$v"; \
		$(HELM) lint --strict --quiet --kube-version $(CHART_KUBE_VERSION) --set "$$v" $(CHART_DIR) || exit 1; \
	done

# Renders the defaults and every variant, and checks that the schema refuses
# a value it does not know (values.schema.json is what rejects typos).
chart-template: $(HELM) ## helm template of charts/tessera, defaults and every variant
	$(HELM) template tessera $(CHART_DIR) -n tessera-system --include-crds --kube-version $(CHART_KUBE_VERSION) >/dev/null
	@for v in $(CHART_VARIANTS); do \
		echo "helm template --set $$v"; \
		$(HELM) template tessera $(CHART_DIR) -n tessera-system --include-crds --kube-version $(CHART_KUBE_VERSION) --set "$$v" >/dev/null || exit 1; \
	done
	@if $(HELM) template tessera $(CHART_DIR) --kube-version $(CHART_KUBE_VERSION) --set scheduler.mode=bogus >/dev/null 2>&1; then \
		echo "chart-template: values.schema.json let scheduler.mode=bogus through" >&2; exit 1; fi
	@if $(HELM) template tessera $(CHART_DIR) --kube-version $(CHART_KUBE_VERSION) --set extender.polcy=binpack >/dev/null 2>&1; then \
		echo "chart-template: values.schema.json let an unknown value (extender.polcy) through" >&2; exit 1; fi

chart: chart-lint chart-template ## lint and render charts/tessera, package it into bin/charts/
	@mkdir -p $(BIN)/charts
	$(HELM) package $(CHART_DIR) -d $(BIN)/charts

$(DEPLOYGEN): FORCE
	@mkdir -p $(TOOLS)
	cd $(HELM_TOOLS_DIR) && $(GO) build -o $@ ./deploygen

deploy: $(DEPLOYGEN) ## render deploy/ from charts/tessera with charts/deploy-values.yaml
	$(DEPLOYGEN) -chart $(CHART_DIR) -values $(CHART_DEPLOY_VALUES) -out deploy

deploy-check: $(DEPLOYGEN) ## fail when deploy/ differs from what charts/tessera renders
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
		$(DEPLOYGEN) -chart $(CHART_DIR) -values $(CHART_DEPLOY_VALUES) -out "$$tmp" && \
		if ! diff -ru -x kustomization.yaml deploy "$$tmp"; then \
			echo "deploy-check: deploy/ is not what charts/tessera renders (diff above: - deploy/, + the chart)." >&2; \
			echo "deploy/ is generated: edit charts/tessera (or charts/deploy-values.yaml), then run 'make deploy'." >&2; \
			exit 1; \
		fi; \
		echo "deploy-check: deploy/ is what charts/tessera renders"

chart-test: chart deploy-check ## the chart's checks in make test: lint, template, package, deploy/ up to date, vet of hack/tools
	@out=$$(cd $(HELM_TOOLS_DIR) && gofmt -l .); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	cd $(HELM_TOOLS_DIR) && $(GO) vet ./...
