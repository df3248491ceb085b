# klbr — the two commands a newcomer needs are `make run` and `make test`.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/klbr-dev/klbr/internal/version.Version=$(VERSION)

export CGO_ENABLED := 1
# FTS5 (history search) is compiled into the bundled SQLite only with this
# tag; every build and test, here, in CI and in the Nix package, carries it.
export GOFLAGS := -tags=sqlite_fts5

.PHONY: all build run test lint gotest pytest soak fuzz bench clean

all: build

## build: compile the binaries into bin/
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/klbr-core ./cmd/klbr-core
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/klbr-kernel ./cmd/klbr-kernel
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/klbr-discord ./cmd/klbr-discord

## run: build, initialize the data directory if needed, and serve
run: build
	$(BIN)/klbr-core init
	$(BIN)/klbr-core serve

## test: every check and test: formatting, vet, Python tests, a 3-minute soak, Go tests with the race detector (fuzz seeds
## included), ending with the list of every skipped Go test and its reason
test: lint pytest soak gotest

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...

# gotest prints what go test does, then every skipped test with its reason.
gotest:
	$(GO) run ./internal/citest/gotest -race -count=1 -timeout 30m ./...

PYTHON ?= python3
pytest:
	PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m unittest discover -s python/klbr-runtime/tests -t python/klbr-runtime
	PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m unittest discover -s behavior/tests -t behavior

## soak: klbr-core under a synthetic mix of inputs, outages, 4xx answers and kills for SOAK (default 3m), then the checker
SOAK ?= 3m
soak:
	KLBR_SOAK=$(SOAK) $(GO) test -race -count=1 -v -run '^TestSoak$$' -timeout 0 ./internal/daemon/

## fuzz: run each fuzz target for FUZZTIME (default 30s)
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzDecodeSendRequest -fuzztime=$(FUZZTIME) ./internal/localapi/
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./internal/config/
	$(GO) test -run='^$$' -fuzz=FuzzReadFrame -fuzztime=$(FUZZTIME) ./internal/worker/
	$(GO) test -run='^$$' -fuzz=FuzzDecodeAdmit -fuzztime=$(FUZZTIME) ./internal/ingress/
	$(GO) test -run='^$$' -fuzz=FuzzParseKDL -fuzztime=$(FUZZTIME) ./internal/datadir/
	$(GO) test -run='^$$' -fuzz=FuzzDecodeManifest -fuzztime=$(FUZZTIME) ./internal/datadir/
	$(GO) test -run='^$$' -fuzz=FuzzNormalize -fuzztime=$(FUZZTIME) ./internal/discord/
	$(GO) test -run='^$$' -fuzz=FuzzParseRetryAfter -fuzztime=$(FUZZTIME) ./internal/provider/
	$(GO) test -run='^$$' -fuzz=FuzzSSE -fuzztime=$(FUZZTIME) ./internal/provider/
	$(GO) test -run='^$$' -fuzz=FuzzJSONResponse -fuzztime=$(FUZZTIME) ./internal/provider/
	$(GO) test -run='^$$' -fuzz=FuzzReplay -fuzztime=$(FUZZTIME) ./internal/provider/
	$(GO) test -run='^$$' -fuzz=FuzzParseRef -fuzztime=$(FUZZTIME) ./internal/store/
	$(GO) test -run='^$$' -fuzz=FuzzFTSQuery -fuzztime=$(FUZZTIME) ./internal/store/

## bench: the admission and turn-loop benchmarks of docs/performance.md
bench:
	$(GO) test -run='^$$' -bench=BenchmarkAdmission -benchtime=3s -count=1 ./internal/localapi/
	$(GO) test -run='^$$' -bench=BenchmarkTurnLoop -benchtime=1x -count=1 ./internal/daemon/
	$(GO) test -run='^$$' -bench='BenchmarkSSE|BenchmarkRequestBody' -benchmem -count=1 ./internal/provider/

clean:
	rm -rf $(BIN)
