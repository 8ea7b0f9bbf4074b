# Sourced by the GPU scripts (acceptance.sh, gpu-session.sh, run_device.sh, capture.sh): puts
# the kit's wheel to use. A kit (tools/gpu-kit/make-kit.sh) carries Flare as the wheel `make
# wheel` builds, KIT/wheel/flare-*.whl; `flare_use_kit KIT` installs it, once, into a venv that
# sees the system's packages (PyTorch):
#   python3 -m venv --system-site-packages KIT/venv
#   KIT/venv/bin/python -m pip install --no-index --no-deps KIT/wheel/flare-*.whl
# (no network; where the system Python has no ensurepip, the venv is made --without-pip and the
# system's pip installs into it with --python), and lays out KIT/installed, the tree the scripts
# read (FLARE_BUILD_DIR): bin/ the venv's console scripts (flare, flared, flare-export,
# flare-timeline, flare-diagnose) and python, lib/ the installed package's flare/lib (the hook,
# its exporter, the Python tracing modules, the vendored libraries), as links; beside them what
# the wheel does not hold: the simulated stack (bin/flare-sim-*, lib/sim, share), launch_cost,
# VERSION and NEEDS. KIT/installed/INSTALLED says which wheel is installed where; a kit whose
# wheel changed is reinstalled.
#
# Then FLARE_BUILD_DIR=FLARE_KIT=KIT/installed and PYTHON=KIT/venv/bin/python are exported, and
# KIT/venv/bin leads PATH. Accepted as KIT: a kit (installed here on first use), its installed/
# tree, or a build tree (CMakeCache.txt; used as it is, and said so). Anything else is an error
# that says what is missing: there is no fallback to another Flare.
# FLARE_KIT_VENV: the venv's path (default KIT/venv).

flare_use_kit() {
  local kit=$1 py=${PYTHON:-python3}
  [ -d "$kit" ] || { echo "flare kit: $kit is not a directory (tools/gpu-kit/make-kit.sh build KIT)" >&2; return 2; }
  kit=$(cd "$kit" && pwd)
  if [ -f "$kit/INSTALLED" ]; then  # already an installed tree
    _flare_kit_export "$kit" "$(sed -n 3p "$kit/INSTALLED")"
    return
  fi
  if [ -f "$kit/CMakeCache.txt" ] && [ -f "$kit/lib/libflare_hook.so" ]; then
    echo "flare kit: $kit is a build tree, used as it is (not an installed wheel)" >&2
    export FLARE_BUILD_DIR=$kit FLARE_KIT=$kit
    return
  fi
  local wheels=("$kit"/wheel/flare-*.whl)
  if [ ! -f "${wheels[0]}" ]; then
    echo "flare kit: no wheel in $kit/wheel/ (flare-*.whl): not a kit made by tools/gpu-kit/make-kit.sh" \
      "(an older kit? make it again: tools/gpu-kit/make-kit.sh build KIT)" >&2
    return 2
  fi
  [ ${#wheels[@]} -eq 1 ] || { echo "flare kit: several wheels in $kit/wheel/: ${wheels[*]}" >&2; return 2; }
  local wheel=${wheels[0]} venv=${FLARE_KIT_VENV:-$kit/venv} view=$kit/installed
  local stamp
  stamp="$(sha256sum "$wheel" | cut -c1-16) $(basename "$wheel") $venv"
  if [ -f "$view/INSTALLED" ] && [ "$(head -1 "$view/INSTALLED")" = "$stamp" ] &&
     [ -x "$venv/bin/python" ]; then
    _flare_kit_export "$view" "$venv"
    return
  fi
  rm -rf "$view" "$venv"
  local log=$kit/install.log how
  if "$py" -m venv --system-site-packages "$venv" > "$log" 2>&1 &&
     "$venv/bin/python" -m pip --version >> "$log" 2>&1; then
    how="the venv's pip"
    "$venv/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check \
      "$wheel" >> "$log" 2>&1
  else
    # Debian/Ubuntu without python3-venv has no ensurepip: a venv without pip, and the system's
    # pip (22.3 or newer: --python) installs into it.
    rm -rf "$venv"
    how="the system pip (--python; the venv has no pip)"
    "$py" -m venv --without-pip --system-site-packages "$venv" >> "$log" 2>&1 &&
      "$py" -m pip --python "$venv/bin/python" install -q --no-index --no-deps \
        --disable-pip-version-check "$wheel" >> "$log" 2>&1
  fi
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "flare kit: installing $(basename "$wheel") into $venv failed with $how (exit $rc):" >&2
    tail -15 "$log" >&2
    echo "flare kit: it needs python3 -m venv and pip, and no network" >&2
    return 2
  fi
  # A python3 that is itself a venv's (the GPU machines' is /opt/torch/.venv/bin/python3, where
  # PyTorch lives): a venv made from it sees the base interpreter's site-packages, not the
  # parent venv's, so a .pth file appends the parent's (after the venv's own: the wheel's flare
  # still wins).
  local parent
  parent=$("$py" -c 'import site, sys
if sys.prefix != sys.base_prefix:
    print("\n".join(site.getsitepackages()))' 2>> "$log")
  if [ -n "$parent" ]; then
    printf '%s\n' "$parent" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/flare-parent-venv.pth"
    echo "flare kit: $py is a venv's; its site-packages ($(echo $parent)) follow the kit venv's" >> "$log"
  fi
  local site
  site=$(cd / && "$venv/bin/python" -c 'import flare, os; print(os.path.dirname(os.path.abspath(flare.__file__)))' 2>> "$log")
  case $site in
    "$venv"/*) ;;
    *) echo "flare kit: the venv imports flare from '$site', not from the wheel it installed in $venv" >&2; return 2 ;;
  esac
  [ -f "$site/lib/libflare_hook.so" ] && [ -x "$site/bin/flared" ] ||
    { echo "flare kit: the installed package at $site has no lib/libflare_hook.so or bin/flared" >&2; return 2; }
  mkdir -p "$view/bin" "$view/lib"
  local f
  for f in python python3 flare flared flare-export flare-timeline flare-diagnose flare-upload; do
    [ -e "$venv/bin/$f" ] && ln -s "$venv/bin/$f" "$view/bin/$f"
  done
  for f in "$site"/lib/*; do ln -s "$f" "$view/lib/$(basename "$f")"; done
  for f in "$kit"/sim/bin/* "$kit"/bin/*; do [ -e "$f" ] && ln -sf "$f" "$view/bin/$(basename "$f")"; done
  [ -d "$kit/sim/lib/sim" ] && ln -s "$kit/sim/lib/sim" "$view/lib/sim"
  [ -d "$kit/sim/share" ] && ln -s "$kit/sim/share" "$view/share"
  for f in VERSION NEEDS tools tests; do [ -e "$kit/$f" ] && ln -s "$kit/$f" "$view/$f"; done
  printf '%s\n%s\n%s\n%s\n' "$stamp" "$site" "$venv" "$how" > "$view/INSTALLED"
  echo "flare kit: installed $(basename "$wheel") into $venv with $how" >&2
  _flare_kit_export "$view" "$venv"
}

_flare_kit_export() {  # _flare_kit_export VIEW VENV
  export FLARE_BUILD_DIR=$1 FLARE_KIT=$1 PYTHON=$2/bin/python
  case ":$PATH:" in *":$2/bin:"*) ;; *) export PATH=$2/bin:$PATH ;; esac
}
