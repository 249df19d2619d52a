#!/usr/bin/env bash
# Cut the users' GPU stack (benchmarks/gpu_stack.txt: CUDA vLLM 0.29.0, torch 2.13.0, Ray 2.60, ...)
# into pieces small enough to carry to a GPU machine without network, one piece per command:
#
#   bash benchmarks/stage_gpu_stack.sh      # here, from the project's root: ~1.8 GB of wheels, a few minutes
#
# writes .gpu/p01 .. .gpu/pNN (57 MiB each: a command carries at most 64 MiB, the working tree
# included; SHA256SUMS in p01) and adds /.gpu/ to .git/info/exclude. On the GPU machine, back to back
# (it is given back 30 s after a command returns):
#   mkdir -p /root/stage && mv .gpu/pNN/* /root/stage/      # one command per piece, carrying .gpu/pNN
#   bash benchmarks/install_gpu_stack.sh                   # ~2 min: joins, installs, imports
#   source benchmarks/gpu_env.sh; setsid nohup bash benchmarks/on_gpu.sh STEP ... &   # then poll
# Measured on 2026-11-28 (4 x H100): ~8 s of machine time per piece, back to back. A machine is held at
# most 30 minutes, staging included; copy each step's log into $OUT as soon as it ends (a machine
# can go back between two polls, and its files with it).
set -euo pipefail
REPO="$(git rev-parse --show-toplevel)"
WHEELS="$REPO/.gpu/wheels"
CHUNK_MIB="${CHUNK_MIB:-57}"
cd "$REPO"
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
mkdir -p "$WHEELS"
plats="--platform manylinux2014_x86_64 --platform manylinux1_x86_64"
for n in $(seq 5 39); do plats="$plats --platform manylinux_2_${n}_x86_64"; done
# This machine's pip configuration may add folders of its own (a CPU torch): PyPI alone.
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $plats -d "$WHEELS" -r benchmarks/gpu_stack.txt
# Exactly the listed wheels (an earlier list's leftovers would be installed too).
wanted=$(grep -v '^#' benchmarks/gpu_stack.txt | sed 's/==.*//' | tr 'A-Z_.' 'a-z--' | sort)
have=$(ls "$WHEELS" | sed -E 's/-[0-9].*//' | tr 'A-Z_.' 'a-z--' | sort)
[ "$wanted" = "$have" ] || { echo "wheels in $WHEELS differ from the list:"; diff <(echo "$wanted") <(echo "$have"); exit 1; }
rm -rf .gpu/p[0-9]* .gpu/parts && mkdir -p .gpu/parts
tar -C "$WHEELS" -cf - . | split -b "${CHUNK_MIB}M" -d -a 2 - .gpu/parts/wheels.tar.
(cd .gpu/parts && sha256sum wheels.tar.* > SHA256SUMS)
i=0
for f in .gpu/parts/wheels.tar.*; do
  i=$((i + 1)); d=$(printf ".gpu/p%02d" "$i"); mkdir -p "$d"; mv "$f" "$d/"
done
mv .gpu/parts/SHA256SUMS .gpu/p01/ && rmdir .gpu/parts
echo "$(du -sm "$WHEELS" | cut -f1) MiB of wheels in $i pieces: .gpu/p01 .. $(printf '.gpu/p%02d' "$i")"
