# Makefile fragment of the kubectl plugin (cmd/kubectl-tessera,
# docs/kubectl-tessera.md), included by the root Makefile. `make build`
# builds it with every other command; `make plugin` builds it alone.

.PHONY: plugin
plugin: $(BIN)/kubectl-tessera ## build the kubectl plugin into bin/ (put bin/ on PATH: kubectl tessera status)
