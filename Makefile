# Ephemeral Sandbox. `make demo` runs the main job, `make test` the tests.
GO       ?= go
BIN      := bin
BINARIES := sandbox-supervisor sandbox-manager-cli sandbox-runtime-cli sandbox-observability-cli sandbox-mcp sandbox-exec-shim
# The clients are started once per call: built without cgo they are static
# (no dynamic loader, no libc start-up, the pure Go user lookup), which
# saves about 3 ms of CPU per start here.
STATIC   := $(filter-out sandbox-supervisor sandbox-exec-shim,$(BINARIES))
# The exec shim, started once per command, is freestanding static C
# (cmd/sandbox-exec-shim/build.sh): about 0.15 ms per start against 1.3 ms
# for a static Go binary.
CC       ?= cc
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
PREFIX   ?= $(HOME)/.local
export GOFLAGS ?= -buildvcs=false

.PHONY: all build test unit e2e demo lint generate install bench soak clean ui dist

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/sandbox-supervisor
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(STATIC))
	CC='$(CC)' sh cmd/sandbox-exec-shim/build.sh $(BIN)/sandbox-exec-shim

# The one test command: static checks, unit tests, end-to-end tests.
test: build
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { gofmt -l .; echo 'gofmt needed'; exit 1; }
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...

# `make demo HTTP=tcp://127.0.0.1:8765` also serves the browser console and
# prints its login URL (port 0 picks one).
HTTP ?=
demo: build
	DEMO_HTTP='$(HTTP)' ./scripts/demo.sh

# The console's vendored libraries (supervisor/web/console/assets/vendor):
# re-fetched from package-lock.json with npm ci, then copied with their
# licenses and a checksum MANIFEST that `go test ./supervisor/web/console`
# checks against the lockfile. Only this target needs Node; build and demo
# use the committed files.
ui:
	cd supervisor/web/console && npm ci --no-audit --no-fund && ./vendor.sh

lint:
	$(GO) vet ./...
	staticcheck ./...

generate:
	$(GO) generate ./...

install: build
	@mkdir -p $(PREFIX)/bin
	install -m 0755 $(addprefix $(BIN)/,$(BINARIES)) $(PREFIX)/bin/
	@if systemctl --user show-environment >/dev/null 2>&1; then \
		$(PREFIX)/bin/sandbox-supervisor install; \
	else \
		echo 'no systemd user manager answers: user units not installed (later: sandbox-supervisor install)'; \
	fi

# Benchmarks: medians and ratios against alternatives measured in the same
# run, no thresholds. `make bench BENCHFLAGS=-quick` for a fast smoke run.
# `make bench BENCHJSON=bench.json` also writes the run as one JSON document.
BENCHFLAGS ?=
BENCHJSON  ?=
bench: build
	$(GO) run ./tests/bench -bin $(BIN) $(if $(BENCHJSON),-json $(BENCHJSON)) $(BENCHFLAGS)

# Soak: SOAK_AGENTS agents against a kernel and a FUSE sandbox for
# SOAK_SECONDS, the supervisor killed every 3 minutes; writes soak/soak.json
# and soak/soak.png (its own module under scripts/soak: the plotting
# library is that tool's dependency only). SOAK_FLAGS adds flags
# (-kill-every 30s, -sample 5s, -out DIR).
SOAK_AGENTS  ?= 32
SOAK_SECONDS ?= 600
SOAK_FLAGS   ?=
soak: build
	cd scripts/soak && $(GO) run . -bin $(CURDIR)/$(BIN) -agents $(SOAK_AGENTS) -seconds $(SOAK_SECONDS) -out $(CURDIR)/soak $(SOAK_FLAGS)

# Release archives, .deb and .rpm, SHA256SUMS in dist/, reproducibly
# (scripts/dist.sh; nfpm is a Go tool pinned in go.mod). VERSION and
# SOURCE_DATE_EPOCH default to git describe and the commit's time.
dist:
	GO='$(GO)' VERSION='$(VERSION)' ./scripts/dist.sh

clean:
	rm -rf $(BIN) dist
