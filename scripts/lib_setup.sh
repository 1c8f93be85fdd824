# Shared by scripts/setup.sh (CPU) and scripts/setup_gpu.sh (GPU); sourced, not run. Both functions
# use the `python` on PATH: source this after activating .venv.

# Every pin of the lock ($1) installed at its version? Prints what differs (the first five) and fails
# if anything does. importlib.metadata: no pip needed for the check.
lock_differs() {
  python - "$1" <<'PY'
import re, sys
from importlib.metadata import PackageNotFoundError, version
wrong = []
for line in open(sys.argv[1]):
    match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
    if match:
        name, want = match.groups()
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have != want:
            wrong.append(f"{name} {have or 'missing'} (lock {want})")
print("; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else ""))
sys.exit(1 if wrong else 0)
PY
}

# grpo-ray installed, editable, from this checkout (the current directory)? Checked from / so that the
# checkout's own folder on sys.path cannot pass for an install (that missed the `grpo-ray` command and
# package metadata).
installed_here() {
  local here=$PWD
  [ -x .venv/bin/grpo-ray ] && (cd / && python -c "import grpo_ray, sys; sys.exit(0 if grpo_ray.__file__.startswith(sys.argv[1] + '/') else 1)" "$here") 2>/dev/null
}
