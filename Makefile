# make demo: the main job (installs first). make test: the test suite (installs first).
# make test-fast: the tests not marked slow (no processes, training, op builds, SLURM, PostgreSQL, long searches).
PYTHON ?= python
export PYTHON
# DeepSpeed JIT-builds its CPU ops here once (about 1-6 minutes each on 2 cores, longer under load); a stable
# folder means once, not per shell.
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/torch_extensions

.PHONY: setup demo test test-fast bench clean

setup:
	bash scripts/setup.sh

demo: setup
	$(PYTHON) -m autotune.demo

# pytest exits 5 when it collects no tests: that is a failure here, never a pass.
test: setup
	@rc=0; $(PYTHON) -m pytest -q tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	exit $$rc

# The quick loop: every test but those marked slow (pyproject.toml [tool.pytest.ini_options] markers).
test-fast: setup
	@rc=0; $(PYTHON) -m pytest -q -m "not slow" tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-fast: pytest collected no tests" >&2; fi; \
	exit $$rc

bench: setup
	@set -e; for f in bench/*.py; do \
		[ -e "$$f" ] || { echo "make bench: no bench/*.py yet"; break; }; \
		case "$$f" in *_build.py) continue;; esac; \
		echo "== $$f"; $(PYTHON) "$$f"; \
	done

# Build and cache output only: out/ and *.db (tuning results, Optuna studies) are kept.
clean:
	rm -rf build dist ./*.egg-info .pytest_cache .hypothesis
	find . \( -path ./.git -o -path ./.venv \) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
