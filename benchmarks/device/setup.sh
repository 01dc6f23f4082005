# Sourced at the start of every device call: `. benchmarks/device/setup.sh`.
# Installs the carried wheels (benchmarks/device/wheels.sh) into benchmarks/results/site once per
# warm machine, then sets PYTHONPATH so the tree's rtserve and those packages import, and
#   S  the install folder, W  where the benchmarks write random weights of the published shapes.
S=$PWD/benchmarks/results/site
W=$PWD/benchmarks/results/weights
mkdir -p "$S" "$W"
# The CPU kit (cpu_kit.sh), one part a call: unpacked and installed once every part is here. First:
# pip --target --upgrade replaces a folder it also writes (bin/), so whlx's py-spy goes in again after it.
K=benchmarks/results/device/cpu_kit
if [ -d "$K" ] && [ ! -e "$S/.installed-cpu-kit" ]; then
  parts=$(ls "$K" | head -1 | sed 's/.*_of_//')
  if [ -n "$parts" ] && [ "$(ls "$K" | wc -l)" -eq "$((10#$parts))" ]; then
    cat "$K"/part_* | tar -x -C benchmarks/results/device \
      && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$S" \
        benchmarks/results/device/cpu_wheels/*.whl \
      && touch "$S/.installed-cpu-kit" && rm -f "$S/.installed-whlx" || return 1
  fi
fi
for set in whl whlx whls whlt; do
  dir=benchmarks/results/device/$set
  if [ -d "$dir" ] && [ ! -e "$S/.installed-$set" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$S" "$dir"/*.whl \
      && touch "$S/.installed-$set" || return 1
  fi
done
# moshi imports sphn at load; only its voice-from-wav path uses it, so a stub stands in until whls comes.
[ -d "$S/sphn" ] || [ -e "$S/sphn.py" ] || touch "$S/sphn.py"
[ -d "$S/sphn" ] && rm -f "$S/sphn.py"
# benchmarks/ too: PYTHONSAFEPATH keeps a script's own folder off sys.path, and the benchmarks import
# their helpers (pyspy, bench_kyutai_served) by name; $S/bin holds py-spy (whlx).
export S W PYTHONPATH=$S:$PWD:$PWD/benchmarks PATH=$S/bin:$PATH PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
