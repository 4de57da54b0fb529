# Makefile fragment for tessera-scheduler (scheduler/, its own Go module:
# kube-scheduler from k8s.io/kubernetes with Tessera's plugin, kept out of
# the root go.mod). The root Makefile includes it.
#
# Targets:
#   scheduler       build bin/tessera-scheduler (static)
#   scheduler-test  go vet, staticcheck and the unit tests (-race) of the
#                   module (part of make test)

SCHEDULER_DIR := $(CURDIR)/scheduler

.PHONY: scheduler scheduler-test

scheduler: ## build bin/tessera-scheduler: kube-scheduler with Tessera's plugin (scheduler/)
	@mkdir -p $(BIN)
	cd $(SCHEDULER_DIR) && CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/tessera-scheduler ./cmd/tessera-scheduler

scheduler-test: deps $(STATICCHECK) ## vet, staticcheck and unit tests (-race) of scheduler/
	cd $(SCHEDULER_DIR) && $(GO) vet ./...
	cd $(SCHEDULER_DIR) && $(STATICCHECK) ./...
	cd $(SCHEDULER_DIR) && CGO_ENABLED=1 $(GO) test -race -count=1 ./...
