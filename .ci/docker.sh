#!/usr/bin/env bash
# Starts a Docker Engine for the image tests (issue 8) and builds the test
# images, as root. Idempotent: an Engine already answering on
# /var/run/docker.sock is reused. Usage: .ci/docker.sh TEST_USER
set -euo pipefail
tester=${1:?test user}
export DEBIAN_FRONTEND=noninteractive
# docker.io: Debian's dockerd (no registry is reachable: images are imported);
# busybox-static: the static userland of the test image.
apt-get install -y -qq --no-install-recommends docker.io busybox-static >/dev/null

groupadd -f docker
usermod -aG docker "$tester"

sock=/var/run/docker.sock
if ! docker -H "unix://$sock" version >/dev/null 2>&1; then
  dk=/var/lib/esbx-docker
  mkdir -p "$dk"
  # No iptables and no bridge: the tests never give containers a network.
  nohup dockerd --host "unix://$sock" --group docker --data-root "$dk/root" \
    --exec-root /run/esbx-docker --pidfile /run/esbx-docker.pid \
    --iptables=false --ip6tables=false --bridge=none >"$dk/dockerd.log" 2>&1 &
  for _ in $(seq 1 120); do
    docker -H "unix://$sock" version >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker -H "unix://$sock" version >/dev/null || { tail -50 "$dk/dockerd.log"; exit 1; }
fi
chgrp docker "$sock" && chmod 0660 "$sock"

# esbx-test/busybox:1 — busybox-static with a marker /etc/os-release and a
# command that exists only in the image; esbx-test/layered:1 adds a layer
# that deletes /etc/deleted-later.txt and adds /etc/layer2.txt.
if ! docker image inspect esbx-test/busybox:1 >/dev/null 2>&1; then
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs"/{bin,etc,tmp,root,usr/local/bin}
  cp /bin/busybox "$rootfs/bin/busybox"
  for c in $("$rootfs/bin/busybox" --list); do
    [ -e "$rootfs/bin/$c" ] || ln -s busybox "$rootfs/bin/$c"
  done
  printf 'NAME="Ephemeral Sandbox test image"\nID=esbx-test\nVERSION_ID=1\n' >"$rootfs/etc/os-release"
  echo 'this file is deleted by the layered image' >"$rootfs/etc/deleted-later.txt"
  printf '#!/bin/sh\necho "only in the image: $ESBX_IMAGE_VAR"\n' >"$rootfs/usr/local/bin/esbx-image-only"
  chmod 0755 "$rootfs/usr/local/bin/esbx-image-only"
  tar -C "$rootfs" -cf "$rootfs.tar" .
  docker import --change 'ENV PATH=/usr/local/bin:/bin' --change 'ENV ESBX_IMAGE_VAR=from-image' \
    "$rootfs.tar" esbx-test/busybox:1 >/dev/null
  rm -rf "$rootfs" "$rootfs.tar"
fi
if ! docker image inspect esbx-test/layered:1 >/dev/null 2>&1; then
  docker rm -f esbx-layered >/dev/null 2>&1 || true
  docker run --name esbx-layered --network none esbx-test/busybox:1 \
    sh -c 'rm /etc/deleted-later.txt && echo layer2 >/etc/layer2.txt'
  docker commit esbx-layered esbx-test/layered:1 >/dev/null
  docker rm esbx-layered >/dev/null
fi
docker image ls 'esbx-test/*'
