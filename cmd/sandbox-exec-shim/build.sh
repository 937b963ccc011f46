#!/bin/sh
# Builds the C exec shim: build.sh OUT. The one place its compiler flags are
# written (the Makefile and the tests that need the shim call it).
# Freestanding and static: no libc, its own _start (see shim.c for why).
# CC defaults to cc; CFLAGS are added last.
set -eu
out=${1:?usage: build.sh OUT}
dir=$(dirname "$0")
exec ${CC:-cc} -std=gnu11 -static -nostdlib -ffreestanding -fno-builtin -fno-stack-protector \
	-fno-asynchronous-unwind-tables -fno-unwind-tables -O2 -Wall -Wextra ${CFLAGS:-} \
	-o "$out" "$dir/shim.c"
