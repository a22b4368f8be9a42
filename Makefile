# Breakwater: one gate (make test) and one demo (make demo). The Makefile bootstraps itself:
# a fresh clone needs only python3.11+, node 20 and npm on the PATH.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The distribution's CPython where it has one with venv, 3.11 or newer: Debian and Ubuntu build it with
# profile-guided and link-time optimisation, which a pyenv or plain source build lacks, and the
# simulator and the tests are pure Python. Otherwise python3 on the PATH; PYTHON=... overrides both.
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' \
	2>/dev/null && echo /usr/bin/python3 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
CDK_OUTDIR ?= cdk.out
STAGE ?= dev
STAGES := $(shell $(PYTHON) -c 'import json; print(" ".join(json.load(open("cdk.json"))["context"].get("breakwater_stages", {"dev": {}})))')
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export SPARK_LOCAL_IP := 127.0.0.1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help install chromium test lint types unit integration infrastructure spark local synth openapi nag cfn-lint package deploy bootstrap demo scenarios chaos serve bench bench-demo bench-scenarios bench-cost bench-fuzz simulate simulate-scale clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(VENV)/.stamp-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

node_modules/.stamp-installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# tests/local/test_html_report.py renders the scenarios' HTML report in headless Chromium. With none on
# the PATH, Debian's package is installed (this runs as root, as CI does); with one, nothing happens.
CHROMIUM_NAMES := chromium chromium-browser google-chrome google-chrome-stable

chromium:  ## headless Chromium for the HTML report's test (Debian's package, unless one is on the PATH)
	@for name in $(CHROMIUM_NAMES); do command -v $$name > /dev/null && exit 0; done; \
	if ! command -v apt-get > /dev/null; then \
		echo "no Chromium on the PATH and no apt-get: install Chromium (tests/local/test_html_report.py needs it)" >&2; \
		exit 0; \
	fi; \
	echo "installing Debian's chromium (headless, for tests/local/test_html_report.py) ..."; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium > /dev/null

install: $(VENV)/.stamp-installed node_modules/.stamp-installed chromium  ## create .venv and install everything (Python packages, the pinned CDK CLI, Chromium)

lint: $(VENV)/.stamp-installed  ## ruff: lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: $(VENV)/.stamp-installed  ## mypy over the construct library, the runtime library, the handlers and local/
	$(VENV)/bin/mypy app.py breakwater_cdk processor examples/orders functions local bin bench glue_jobs sim

synth: install  ## synthesize every stage's stack (cdk.json breakwater_stages) into cdk.out/ (runs cdk-nag)
	$(CDK) synth --quiet --output $(CDK_OUTDIR) > /dev/null
	@echo "templates: $(foreach stage,$(STAGES),$(CDK_OUTDIR)/Breakwater-$(stage).template.json)"

cfn-lint: synth  ## cfn-lint on every stage's synthesized template
	$(VENV)/bin/cfn-lint $(foreach stage,$(STAGES),$(CDK_OUTDIR)/Breakwater-$(stage).template.json)

package: $(VENV)/.stamp-installed  ## build the wheel (breakwater_cdk, the runtime library, handlers) into dist/
	rm -rf build dist
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .  # the build backend comes from PyPI
	rm -rf build
	@ls dist/*.whl

openapi: $(VENV)/.stamp-installed  ## write docs/openapi.json, the API's OpenAPI 3.0 document (routes, models, answers)
	PYTHONPATH=functions:. $(PY) -m breakwater_cdk.openapi --out docs/openapi.json

test: install  ## ruff + mypy + every test tier + cdk-nag + cfn-lint on the synthesized template
	$(MAKE) lint
	$(MAKE) types
	$(MAKE) cfn-lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

unit: install  ## only tests/unit
	$(PY) -m pytest -q tests/unit

integration: install  ## only tests/integration (handlers against moto)
	$(PY) -m pytest -q tests/integration

infrastructure: install  ## only tests/infrastructure (template assertions, cdk-nag)
	$(PY) -m pytest -q tests/infrastructure

spark: install  ## only tests/spark (the Glue jobs on a local SparkSession)
	$(PY) -m pytest -q tests/spark

local: install  ## only tests/local (the emulator: moto's patched servers, mappings, API, the demo's run)
	$(PY) -m pytest -q tests/local

bootstrap: install  ## one-time per account/region: cdk bootstrap (uses your usual AWS credentials)
	$(CDK) bootstrap

deploy: install  ## deploy one stage (STAGE=dev by default, or prod...) to the account/region of your AWS credentials
	$(CDK) deploy --context stage=$(STAGE) --require-approval broadening Breakwater-$(STAGE)

demo: install  ## run the main job on the embedded AWS (moto): a noisy neighbour, Breakwater vs naive (fair: --configurations)
	$(PY) -m local demo

scenarios: install  ## every scenario in turn, naive, fair and breakwater each (python -m local demo --scenario all), out/
	$(PY) -m local demo --scenario all

chaos: install  ## faults injected under 10,000 keyed messages; checks nothing lost, done twice or unexpected (out/chaos/)
	$(PY) -m local chaos --messages 10000 --drain-seconds 300

serve: install  ## keep the embedded AWS up for your own traffic (URL and keys in out/endpoint.json)
	$(PY) -m local serve

bench: install  ## run the benchmarks in bench/ (figures go to docs/performance.md by hand)
	$(PY) bench/ingest.py
	$(PY) bench/ingest_buckets.py
	$(PY) bench/controller.py
	$(PY) bench/worker.py
	$(PY) bench/stream.py
	$(PY) bench/moto_send.py

bench-demo: install  ## the demo's goal over 5 runs of its Breakwater half (quiet p99 burst / before; ~13 min)
	$(PY) bench/demo_ratio.py --runs 5

bench-scenarios: install  ## make scenarios timed, and each scenario's goal judged on its reports (~15 min)
	$(PY) bench/scenarios.py

simulate: install  ## the seed-scale scenarios in virtual time (1,000 tenants, hours of traffic), out/sim/, again at 2 per mapping
	$(PY) -m sim --scenario all --concurrency-variants 2
	@echo "the scale scenario (10,000 tenants, 20,000 messages/s, the hottest DynamoDB items) runs apart: make simulate-scale"

simulate-scale: install  ## 10,000 tenants at 20,000 messages/s for 10 virtual minutes, AWS's limits on, out/sim/scale.json
	$(PY) -m sim --scenario scale

bench-fuzz: install  ## Schemathesis against the emulated API, 800 examples per route and mode (over 2,000 requests)
	$(PY) bench/fuzz.py

bench-cost: install  ## $ per million delivered messages by service, Breakwater beside naive (bench/cost.py)
	$(PY) bench/cost.py

clean:  ## remove build output (keeps .venv and node_modules)
	rm -rf $(CDK_OUTDIR) out build dist .pytest_cache .mypy_cache .ruff_cache
