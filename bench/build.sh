#!/bin/sh
# Build the C helpers of the end-to-end benchmark: the fake MongoDB sink, the QoS 1
# publisher, the MQTT relay that times the consumers and the reference consumer
# (bench/e2e.py runs this on first use). Usage: bench/build.sh [OUTDIR]
set -e
src="$(cd "$(dirname "$0")" && pwd)"
out="$(cd "${1:-$src}" && pwd)"
# Each binary is written beside its place and renamed onto it: a test process may be
# running the previous one, or building the same one at the same time.
build() {
    name=$1
    shift
    gcc -O2 -Wall -Wextra "$@" -o "$out/.$name.$$" "$src/$name.c"
    mv -f "$out/.$name.$$" "$out/$name"
}
build fakemongo
build qos1pub
build mqttrelay -pthread
build idealsub
