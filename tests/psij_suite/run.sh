#!/usr/bin/env bash
# Runs psij-python 0.9.11's own test suite against the `pilot` executor plugin.
#
#   tests/psij_suite/run.sh [--install] PSIJ_CHECKOUT [PYTHON] [-- PYTEST_ARGS...]
#
# PSIJ_SUITE=main runs the suite of a psij-python `main` checkout instead (its staging tests only:
# `-- -k test_staging`): --install then installs psij-python from that checkout and copies in
# the local.mustache its setup.py leaves out; the installed psij may call itself 0.9.3 there.
#
# PSIJ_CHECKOUT  a psij-python source tree at tag 0.9.11 (git clone, or `git archive 0.9.11`).
#                The sdist on PyPI cannot serve: its tests/ holds only the test_*.py files, without
#                conftest.py, _test_tools.py, executor_test_params.py, plugins1/, plugins2/,
#                test_nodefile.sh, user_guide/ or getting_started/, so nothing collects.
# PYTHON         the interpreter of a venv holding psij-python==0.9.11, pytest, pytest-timeout,
#                requests, filelock<3.19 and this project (default: $PYTHON, else python3).
#                With --install, those are pip-installed into it first (this project from this
#                checkout, non-editable, so the plugin is found the way users get it).
#
# The plugin starts an embedded pilot (tests/psij_suite/psij-suite.toml: 2 virtual nodes of 4 cores,
# which test_resourcespec's node_count=2 x processes_per_node=4 needs) in a private PILOT_HOME.
# Exits non-zero when a test fails or a pilot process outlives the run.

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
project="$(cd "$here/../.." && pwd)"

install=0
if [[ "${1:-}" == "--install" ]]; then
    install=1
    shift
fi
if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
fi
src="$(cd "$1" && pwd)"
shift
py="${PYTHON:-python3}"
if [[ $# -gt 0 && "$1" != "--" ]]; then
    py="$1"
    shift
fi
if [[ $# -gt 0 && "$1" == "--" ]]; then
    shift
fi

if [[ ! -f "$src/tests/conftest.py" || ! -d "$src/tests/plugins1" ]]; then
    echo "run.sh: $src is not a psij-python source tree with its tests (no tests/conftest.py or tests/plugins1)" >&2
    exit 2
fi
checkout_version="$(sed -n "s/^VERSION = '\(.*\)'/\1/p" "$src/src/psij/version.py" 2>/dev/null || true)"
suite="${PSIJ_SUITE:-0.9.11}"
if [[ "$suite" == "0.9.11" && "$checkout_version" != "0.9.11" ]]; then
    echo "run.sh: warning: $src is psij-python ${checkout_version:-(unknown version)}, not 0.9.11" >&2
fi

if [[ $install == 1 ]]; then
    if [[ "$suite" == "main" ]]; then
        "$py" -m pip install -q "$src"
        psij_dir="$("$py" -c 'import os, psij; print(os.path.dirname(psij.__file__))')"
        mkdir -p "$psij_dir/executors/local"
        cp "$src/src/psij/executors/local/local.mustache" "$psij_dir/executors/local/"
    else
        "$py" -m pip install -q "psij-python==0.9.11"
    fi
    "$py" -m pip install -q "pytest>=6.2" pytest-timeout "requests>=2.25.1" \
        "filelock>=3.4,<3.19"
    "$py" -m pip install -q "$project"
    "$py" -m pip install -q --force-reinstall --no-deps "$project"  # same version number, new code
fi

# The plugin must come from the installation, not from a source tree on the path.
PSIJ_SUITE="$suite" "$py" - <<'EOF'
import os, sys
try:
    import filelock, pytest, pytest_timeout, requests  # noqa: F401  (psij's conftest imports these)
    import psij
    from psij.version import VERSION
except ImportError as exc:
    sys.exit(f"run.sh: {exc}; install the suite's requirements (or pass --install)")
if os.environ["PSIJ_SUITE"] == "0.9.11" and VERSION != "0.9.11":
    sys.exit(f"run.sh: psij-python {VERSION} is installed; this suite is pinned to 0.9.11")
try:
    ex = psij.JobExecutor.get_instance("pilot")
except ValueError as exc:
    sys.exit(f"run.sh: the pilot plugin does not load: {exc!r} {exc.__cause__!r}; is this project installed?")
print(f"run.sh: psij-python {VERSION}, executor {ex} from {type(ex).__module__}")
EOF

work="$(mktemp -d "${TMPDIR:-/tmp}/psij-suite.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pilot-home"
printf '[pytest]\n' > "$work/pytest.ini"  # keeps any enclosing project's pytest config out

export PILOT_HOME="$work/pilot-home"
export PILOT_CONFIG="$here/psij-suite.toml"
unset PILOT_NAME
# plugins1/plugins2 are needed by test_executor_loading.py; never add $src/src (psij is installed).
export PYTHONPATH="$src/tests/plugins1:$src/tests/plugins2"

cd "$src"
set +e
"$py" -m pytest -c "$work/pytest.ini" --rootdir "$src" -p no:cacheprovider -ra \
    --timeout=120 --executors=pilot,pilot:single,pilot:multiple "$@" tests
rc=$?
set -e

# The embedded pilot stops when pytest exits; anything still running from this PILOT_HOME leaked.
"$py" - "$PILOT_HOME" <<'EOF' || { [[ $rc != 0 ]] || rc=1; }
import os, sys, time
import psutil
home = sys.argv[1]
def leftovers():
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if any(home in a for a in p.cmdline()) or any(home in v for v in p.environ().values()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
deadline = time.monotonic() + 15
while (left := leftovers()) and time.monotonic() < deadline:
    time.sleep(0.2)
if left:
    sys.exit("run.sh: pilot processes outlived the run: " + ", ".join(f"{p.pid} {p.cmdline()}" for p in left))
EOF
exit "$rc"
