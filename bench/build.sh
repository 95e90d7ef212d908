#!/bin/sh
# Build the C helpers of the end-to-end benchmark: the fake MongoDB sink, the QoS 1
# publisher, the MQTT relay that times the consumers and the reference consumer
# (bench/e2e.py runs this on first use). Usage: bench/build.sh [OUTDIR]
set -e
src="$(cd "$(dirname "$0")" && pwd)"
out="$(cd "${1:-$src}" && pwd)"
gcc -O2 -Wall -Wextra -o "$out/fakemongo" "$src/fakemongo.c"
gcc -O2 -Wall -Wextra -o "$out/qos1pub" "$src/qos1pub.c"
gcc -O2 -Wall -Wextra -pthread -o "$out/mqttrelay" "$src/mqttrelay.c"
gcc -O2 -Wall -Wextra -o "$out/idealsub" "$src/idealsub.c"
