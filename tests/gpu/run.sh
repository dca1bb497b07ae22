#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/run.sh - one-shot checks of loaderd on a machine with an NVIDIA GPU
#
# Usage: tests/gpu/run.sh            (from anywhere; as root or not)
#
# For a machine with a GPU, its driver, nvcc and python3 with numpy and pytest,
# but no package registry: the libraries loaderd builds against come as .deb
# files in tests/gpu/debs/ (made on a development machine by
# tests/gpu/fetch-debs.sh), unpacked here with dpkg -x into a private prefix,
# never into /. Then it builds loaderd from the tree with -Dcuda=enabled,
# starts it, and checks:
#   1. the unit tests, with the real driver: test-cuda gpu must PASS, not skip
#   2. `consume --device cuda:0` is delivered and cuda:N out of range is refused
#   3. two torch clients on cuda:0 and a host client in broadcast: every batch's
#      bytes equal (sha256 per batch, tests/gpu/torch_clients.py)
#   4. a cuda:0 client killed with SIGKILL while holding batches: the surviving
#      client gets every batch, slots_leased is back to 0
#   5. delivered GB/s to a torch client and the copy engine's own GB/s
#      (status: bytes / busy_s) against pinned cudaMemcpy H2D (h2d-bw.cu):
#      target >= 90 %; next() p50 on cuda:0 minus on the host: target <= 50 us
#   6. host delivery on the same daemon, byte for byte (tests/integration/test_cuda.py)
# and ends with one line: "gpu run: PASS ..." or "gpu run: FAIL ...".
# Everything it prints also goes to $OUT/gpu-run.log when $OUT is set.
# Environment: PYTHON (default python3), CUDA_HOME, LOADERD_GPU_PREGEN_PROTO=1
# (use the pregenerated protobuf sources even where protoc-c runs).
# Budget: well under 5 minutes (the build is most of it).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
debs=$root/tests/gpu/debs
sys=${LOADERD_GPU_PREFIX:-/tmp/loaderd-gpu-sys}
build=${LOADERD_GPU_BUILD:-/tmp/loaderd-gpu-build}
work=$(mktemp -d /tmp/ldrgpu.XXXXXX)
log=${OUT:+$OUT/gpu-run.log}
PY=${PYTHON:-python3}
t0=$(date +%s)
passed=()
failed=()
daemon_pid=

if [[ -n "$log" ]]; then
	exec > >(tee "$log") 2>&1
fi

note() { printf '\n==> [%3ds] %s\n' $(($(date +%s) - t0)) "$*"; }
ok() { passed+=("$1"); echo "PASS: $1"; }
bad() { failed+=("$1"); echo "FAIL: $1${2:+ -- $2}"; }

finish() {
	if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
		kill "$daemon_pid"
		wait "$daemon_pid" 2>/dev/null
	fi
	local secs=$(($(date +%s) - t0))
	echo
	if ((${#failed[@]} == 0 && ${#passed[@]} > 0)); then
		echo "gpu run: PASS (${#passed[@]} checks, ${secs} s)"
		exit 0
	fi
	echo "gpu run: FAIL (${#failed[@]} of $((${#passed[@]} + ${#failed[@]})) checks: ${failed[*]:-nothing ran}; ${secs} s)"
	exit 1
}
trap finish EXIT

# --------------------------------------------------------------- machine
note "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
command -v nvcc >/dev/null && nvcc --version | tail -1
"$PY" -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)' 2>&1 || true

# ------------------------------------------------- dependencies from .deb
note "unpack tests/gpu/debs into $sys"
if compgen -G "$debs/*.deb" >/dev/null; then
	rm -rf "$sys"
	mkdir -p "$sys"
	for f in "$debs"/*.deb; do
		dpkg -x "$f" "$sys" || bad "unpack $(basename "$f")"
	done
	# Debian's .pc files say prefix=/usr: point them at the private prefix.
	find "$sys" -name '*.pc' -exec sed -i -E "s#^([a-z_]+)=/usr#\\1=$sys/usr#" {} +
	arch=$(ls "$sys/usr/lib" | grep -m1 -- '-linux-gnu$' || true)
	libdir=$sys/usr/lib/${arch:-x86_64-linux-gnu}
	export PKG_CONFIG_PATH=$libdir/pkgconfig:$sys/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
	export CMAKE_PREFIX_PATH=$sys/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
	export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	mkdir -p "$sys/bin"
	export PATH=$sys/bin:$sys/usr/bin:$PATH
	if ! command -v pkg-config >/dev/null && [[ -x $sys/usr/bin/pkgconf ]]; then
		ln -sf "$sys/usr/bin/pkgconf" "$sys/bin/pkg-config"
	fi
	# protoc-c needs the C++ runtime of its .deb's distribution; where it does
	# not run, a stand-in copies what fetch-debs.sh generated.
	if [[ -n "${LOADERD_GPU_PREGEN_PROTO:-}" ]] || ! protoc-c --version >/dev/null 2>&1; then
		echo "protoc-c from the .deb does not run here: using the pregenerated loader.pb-c.[ch]"
		cat >"$sys/bin/protoc-c" <<-SHIM
			#!/bin/sh
			for a in "\$@"; do case "\$a" in --c_out=*) out=\${a#--c_out=} ;; esac; done
			cp "$debs/proto/loader.pb-c.c" "$debs/proto/loader.pb-c.h" "\$out/"
		SHIM
		chmod +x "$sys/bin/protoc-c"
	fi
else
	echo "no .deb files in $debs (tests/gpu/fetch-debs.sh makes them): using the system's libraries"
fi

# ------------------------------------------------------------------ build
cuda_inc=
for d in "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include \
	"$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/../include"; do
	if [[ -f "$d/cuda.h" ]]; then
		cuda_inc=$(cd "$d" && pwd)
		break
	fi
done
note "build $build (cuda.h in ${cuda_inc:-?})"
if [[ -z "$cuda_inc" ]]; then
	bad "cuda.h" "no cuda.h found (CUDA_HOME, /usr/local/cuda, beside nvcc)"
	exit 1
fi
rm -rf "$build"
if meson setup "$build" -Dcuda=enabled -Dcuda-headers="$cuda_inc" -Dwerror=false >"$work/setup.log" 2>&1 &&
	ninja -C "$build" >"$work/build.log" 2>&1; then
	ok "build"
	sed -n '/Features/,/^$/p' "$work/setup.log"
else
	tail -40 "$work/setup.log" "$work/build.log" 2>/dev/null
	bad "build"
	exit 1
fi

# -------------------------------------------------------------- unit tests
note "meson test (unit + gpu)"
if timeout 120 meson test -C "$build" --suite unit --suite gpu --print-errorlogs >"$work/mtest.log" 2>&1; then
	ok "meson unit"
else
	bad "meson unit"
fi
grep -E '^ *[0-9]+/[0-9]+ ' "$work/mtest.log"
if grep -qE 'cuda-gpu +OK' "$work/mtest.log"; then
	ok "test-cuda gpu"
	grep -E '^(driver|out of range)' "$build/meson-logs/testlog.txt" | head -3
else
	bad "test-cuda gpu" "did not pass with the real driver (skipped or failed)"
	grep -A5 'cuda-gpu' "$build/meson-logs/testlog.txt" | head -20
fi

# ------------------------------------------------------------ the daemon
note "loaderd on a private socket"
sock=$work/ld.sock
ctl() { timeout 120 "$build/client/loaderctl" --socket "$sock" "$@"; }
"$build/daemon/loaderd" --socket "$sock" --workers 4 >"$work/loaderd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
	ctl status >/dev/null 2>&1 && break
	sleep 0.1
done
if ctl status >/dev/null 2>&1; then
	ok "daemon starts"
else
	bad "daemon starts"
	cat "$work/loaderd.log"
	exit 1
fi

# 256 MiB of uint16 tokens, seq_len 1024, batch 64: 128 KiB per field per batch
"$PY" - "$work/tok.bin" <<'EOF'
import sys, numpy as np
np.random.default_rng(1).integers(0, 50000, size=(128 << 20) + 1, dtype=np.uint16).tofile(sys.argv[1])
EOF
cat >"$work/spec.json" <<EOF
{"name": "gpu", "source": {"kind": "tokens", "path": "$work/tok.bin", "dtype": "uint16", "seq_len": 1024},
 "batch_size": 64, "epochs": 1, "prefetch": 16}
EOF
ctl create --spec "$work/spec.json" || bad "create pipeline"

note "consume --device cuda:0"
out=$(ctl consume gpu --device cuda:0 --batches 4 2>&1)
rc=$?
echo "$out"
if ((rc == 0)); then
	ok "cuda:0 attach and delivery (loaderctl)"
else
	bad "cuda:0 attach" "loaderctl consume --device cuda:0 failed"
fi
out=$(ctl consume gpu --device cuda:99 --batches 1 2>&1)
echo "$out"
if grep -q "cuda:99 requested, [0-9]* devices* present" <<<"$out"; then
	ok "cuda:99 out of range"
else
	bad "cuda:99 out of range"
fi

# Trainers: torch processes with the package from the tree (tests/gpu/torch_clients.py).
export PYTHONPATH=$root/client/python${PYTHONPATH:+:$PYTHONPATH}
export LOADERD_LIBRARY=$build/client/libloader.so
tc() { timeout 300 "$PY" "$root/tests/gpu/torch_clients.py" "$@"; }
mkspec() { # name, seq_len, batch, epochs, prefetch, min_clients, output dtype
	cat >"$work/$1.json" <<-EOF
		{"name": "$1", "source": {"kind": "tokens", "path": "$work/tok.bin", "dtype": "uint16",
		 "seq_len": $2, "output_dtype": "$7"}, "batch_size": $3, "epochs": $4, "prefetch": $5,
		 "min_clients": $6}
	EOF
	ctl create --spec "$work/$1.json" >/dev/null || bad "create pipeline $1"
}
leased() { # slots_leased of pipeline $1
	ctl --json status | "$PY" -c 'import json, sys; d = json.load(sys.stdin)
print([p["slots_leased"] for p in d["pipelines"] if p["name"] == sys.argv[1]][0])' "$1"
}

note "broadcast: two torch clients on cuda:0 and one on the host, byte for byte"
mkspec bc 1024 64 1 16 3 int64
tc hashes "$sock" bc cuda:0 "$work/bc-gpu1.txt" &
p1=$!
tc hashes "$sock" bc cuda:0 "$work/bc-gpu2.txt" &
p2=$!
tc hashes "$sock" bc cpu "$work/bc-cpu.txt"
wait $p1 && wait $p2
nb=$(wc -l <"$work/bc-cpu.txt")
if ((nb > 0)) && cmp -s "$work/bc-cpu.txt" "$work/bc-gpu1.txt" && cmp -s "$work/bc-cpu.txt" "$work/bc-gpu2.txt"; then
	ok "broadcast cuda:0 x2 == host ($nb batches)"
else
	bad "broadcast cuda:0 == host" "batch hashes differ ($nb host batches)"
	diff "$work/bc-cpu.txt" "$work/bc-gpu1.txt" | head -5
fi

note "SIGKILL of a cuda:0 client holding batches: its slots come back"
mkspec kill 1024 64 1 8 2 int64
# started directly (not through tc), so that $! is the trainer itself
"$PY" "$root/tests/gpu/torch_clients.py" hold "$sock" kill 4 >"$work/hold.log" 2>&1 &
ph=$!
tc hashes "$sock" kill cuda:0 "$work/kill-gpu.txt" &
pk=$!
for _ in $(seq 300); do grep -q holding "$work/hold.log" && break; sleep 0.1; done
cat "$work/hold.log"
sleep 1
kill -9 $ph
wait $ph 2>/dev/null
if wait $pk && (($(wc -l <"$work/kill-gpu.txt") == nb)); then
	ok "the surviving cuda:0 client got all $nb batches"
else
	bad "SIGKILL" "the surviving client did not finish ($(wc -l <"$work/kill-gpu.txt") of $nb batches)"
fi
l=$(leased kill)
if [[ "$l" == 0 ]]; then
	ok "killed client's device slots returned (slots_leased 0)"
else
	bad "SIGKILL" "slots_leased $l after the kill"
fi

note "bandwidth: delivered to cuda:0 and the copy engine's own rate"
# int32 tokens kept as int32 (no widening in the workers, and a dtype every
# torch has, so the client makes no device copy): 8 MiB per batch
"$PY" -c 'import sys, numpy as np
np.fromfile(sys.argv[1], np.uint16)[:128 << 20].view(np.int32).tofile(sys.argv[2])' "$work/tok.bin" "$work/tok32.bin"
cat >"$work/bw.json" <<EOF
{"name": "bw", "source": {"kind": "tokens", "path": "$work/tok32.bin", "dtype": "int32",
 "seq_len": 8192, "output_dtype": "int32"}, "batch_size": 128, "epochs": 0, "prefetch": 16}
EOF
ctl create --spec "$work/bw.json" >/dev/null || bad "create pipeline bw"
bw=$(tc bw "$sock" bw 10)
echo "$bw"
engine=$(ctl --json status | "$PY" -c 'import json, sys; d = json.load(sys.stdin)["cuda"]["devices"]["cuda:0"]
print("%.2f" % (d["bytes"] / d["busy_s"] / 1e9))')
echo "copy engine: $engine GB/s while busy"
echo "$bw" >"$work/bw-result.json"

note "latency of next(): cuda:0 against host, 2 ms steps"
mkspec lat 256 8 0 32 1 int64
lat_cpu=$(tc latency "$sock" lat cpu 2000)
lat_gpu=$(tc latency "$sock" lat cuda:0 2000)
echo "$lat_cpu"
echo "$lat_gpu"
added=$("$PY" -c 'import json, sys; a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("%.1f" % (b["p50_us"] - a["p50_us"]))' "$lat_cpu" "$lat_gpu")
echo "added p50 per batch on cuda:0: $added us"
if "$PY" -c "import sys; sys.exit(0 if float('$added') <= 50 else 1)"; then
	ok "added latency ${added} us <= 50 us"
else
	bad "added latency" "${added} us > 50 us"
fi

note "host delivery on the same daemon"
if out=$(ctl --json consume gpu 2>&1); then
	echo "$out"
	ok "host consume"
else
	echo "$out"
	bad "host consume"
fi
grep -i cuda "$work/loaderd.log"

note "pytest tests/integration/test_cuda.py"
if LOADERD_BUILD=$build timeout 180 "$PY" -m pytest -q -p no:cacheprovider -rs \
	tests/integration/test_cuda.py >"$work/pytest.log" 2>&1; then
	ok "pytest test_cuda"
else
	bad "pytest test_cuda"
fi
tail -15 "$work/pytest.log"

# ------------------------------------------------ reference bandwidth
note "pinned cudaMemcpy H2D (tests/gpu/h2d-bw.cu)"
if command -v nvcc >/dev/null; then
	if nvcc -O2 -o "$work/h2d-bw" tests/gpu/h2d-bw.cu >"$work/nvcc.log" 2>&1 &&
		timeout 60 "$work/h2d-bw" | tee "$work/h2d.txt"; then
		ok "h2d-bw"
		pinned=$(sed -n 's/^h2d-bw: pinned *\([0-9.]*\) GB\/s$/\1/p' "$work/h2d.txt" | head -1)
		delivered=$("$PY" -c 'import json, sys; print("%.2f" % json.load(open(sys.argv[1]))["gbps"])' "$work/bw-result.json" 2>/dev/null)
		echo "pinned cudaMemcpy ${pinned:-?} GB/s; copy engine ${engine:-?} GB/s; delivered to a torch client ${delivered:-?} GB/s"
		if [[ -n "$pinned" && -n "$engine" ]] &&
			"$PY" -c "import sys; sys.exit(0 if $engine >= 0.9 * $pinned else 1)"; then
			ok "copy engine >= 90 % of pinned cudaMemcpy ($engine / $pinned GB/s)"
		else
			bad "copy engine bandwidth" "${engine:-?} GB/s against ${pinned:-?} GB/s pinned (target 90 %)"
		fi
	else
		cat "$work/nvcc.log"
		bad "h2d-bw"
	fi
else
	echo "no nvcc: no reference figure"
fi
