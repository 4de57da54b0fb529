# Makefile fragment of the kubectl plugin (cmd/kubectl-tessera,
# docs/kubectl-tessera.md), included by the root Makefile. `make build`
# builds it with every other command; `make plugin` builds it alone.

.PHONY: plugin
plugin: $(BIN)/kubectl-tessera ## build the kubectl plugin into bin/ (put bin/ on PATH: kubectl tessera status)

# The status page test (test/e2e/statuspage_test.go) opens the extender's
# /status in a real headless Chromium: Debian's chromium, installed when
# missing (needs root). The test fails under CI=true without it.
TEST_CHROMIUM ?= chromium

.PHONY: test-chromium
test-chromium: ## install Debian's chromium with apt-get when it is not on PATH (the status page test)
	@if command -v $(TEST_CHROMIUM) >/dev/null 2>&1; then \
		echo "test-chromium: using $$(command -v $(TEST_CHROMIUM))"; \
	else \
		echo "test-chromium: $(TEST_CHROMIUM) not found, installing chromium with $(TEST_APT_GET)"; \
		$(TEST_APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(TEST_APT_GET) install -y -qq --no-install-recommends chromium; \
	fi

# test/test.mk's test-deps: what the integration tests run.
test-deps: test-chromium
