# pathmend — build, test and lab targets. `make help` lists them.

SHELL     := /bin/bash
# hack/go runs the go on PATH when it is at least go.mod's version, or
# fetches the pinned official toolchain once (see the script).
GO        ?= $(CURDIR)/hack/go
export GO
# The version a build carries: deploy/VERSION on its release tag,
# <deploy/VERSION>-dev+<commit> anywhere else (hack/version.sh).
VERSION   ?= $(shell hack/version.sh)
LDFLAGS   := -s -w -X main.version=$(VERSION)
BIN       := bin/pathmend
# An image tag cannot hold "+": v0.1.0-dev+abc becomes v0.1.0-dev_abc.
IMAGE_TAG ?= $(subst +,_,$(VERSION))
IMAGE     ?= ghcr.io/pathmend/pathmend:$(IMAGE_TAG)
GOFLAGS_BUILD := -trimpath -ldflags '$(LDFLAGS)'
STATICCHECK_VERSION ?= v0.8.2

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build the static pathmend binary into bin/
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN) ./cmd/pathmend

# GO_TEST_TIMEOUT bounds one package's test binary. go test's default (10
# minutes) is a guess a loaded machine can miss: TestBlackBox_HostileCallers
# (cmd/pathmend) builds pathmend itself, and with a cold build cache and the
# host's load average above 30 that build alone took over 10 minutes.
GO_TEST_TIMEOUT ?= 45m
export GO_TEST_TIMEOUT

.PHONY: test
test: ## run every unit test with -race, the node simulation's 10,000 schedules, then csi-sanity (needs root for loop devices and mounts)
	hack/test-deps.sh
	$(GO) test -race -count=1 -timeout $(GO_TEST_TIMEOUT) ./...
	$(MAKE) chart-test
	$(MAKE) sim
	$(MAKE) sanity

SIM_SCHEDULES ?= 10000
SIM_STEPS     ?= 30
SIM_FIRST     ?= 1

.PHONY: sim
sim: ## run the node simulation without -race: SIM_SCHEDULES schedules (10000) of SIM_STEPS steps (30) from seed SIM_FIRST; ends with "N schedules, M violations"
	$(GO) test -c -o bin/nodesim.test ./internal/nodesim
	bin/nodesim.test -test.run 'TestSimulation$$' -test.timeout=0 -schedules=$(SIM_SCHEDULES) -steps=$(SIM_STEPS) -first=$(SIM_FIRST)

.PHONY: chart-test
chart-test: ## the Helm chart (deploy/helm/pathmend): helm lint --strict, its defaults render deploy/overlays/repair, its values reach pathmend's flags (module deploy/helm/charttest)
	cd deploy/helm/charttest && GO=$(GO) $(GO) test -count=1 -timeout $(GO_TEST_TIMEOUT) ./...

.PHONY: sanity
sanity: ## run csi-sanity against the real NodeServer on loop devices (root); fails if it skipped
	hack/sanity.sh

.PHONY: verify
verify: ## gofmt, go vet and staticcheck; go vet of the chart's test module (staticcheck there would analyse the whole Helm SDK for one test file)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd deploy/helm/charttest && $(GO) vet ./...

.PHONY: image
image: ## build the container image (needs a Docker engine)
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

.PHONY: deploy-check
deploy-check: ## check the manifests in deploy/ (strict decode, overlays, invariants; kubectl and promtool add checks when installed)
	$(GO) test -count=1 ./deploy/...

.PHONY: clean
clean: ## remove build outputs
	rm -rf bin .sanity.log

-include hack/lab/lab.mk
-include hack/lab/kubelet/kubelet.mk
