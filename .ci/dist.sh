#!/usr/bin/env bash
# CI of the release artefacts (issue 31), as root, called by .ci/run:
# make dist (twice: the SHA256SUMS must match), install the .deb with dpkg,
# then as a fresh user with an empty home run the demo with only the
# installed /usr/bin binaries (the CLIs autostart the supervisor), setup,
# and check the units (systemd-analyze --user verify), the AppArmor profile
# (apparmor_parser), the man page and the bash completions; remove the
# package and check every file of it is gone; check the .rpm's file list.
# The host is restored on any exit (trap): package purged, user removed.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive
GO=$(command -v go || echo /usr/local/go/bin/go)
export PATH=$(dirname "$GO"):$PATH
# apparmor: apparmor_parser; rpm: rpm -qlp; man-db: man; the arm64 cross
# compiler (and its kernel headers) for the arm64 C exec shim; fuse3: the
# package's dependency; bash-completion: what the completions plug into.
apt-get install -y -qq --no-install-recommends apparmor rpm man-db gcc-aarch64-linux-gnu linux-libc-dev-arm64-cross \
	fuse3 bash-completion systemd >/dev/null

pkguser=esbx-pkg
work=
cleanup() {
	local p
	if id $pkguser >/dev/null 2>&1; then
		# The user's processes (an autostarted supervisor and its holders).
		for p in $(pgrep -u $pkguser || true); do kill -9 "$p" 2>/dev/null || true; done
	fi
	if dpkg -s ephemeral-sandbox >/dev/null 2>&1; then dpkg -P ephemeral-sandbox >/dev/null || true; fi
	if id $pkguser >/dev/null 2>&1; then userdel -r $pkguser >/dev/null 2>&1 || true; fi
	if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
cleanup
work=$(mktemp -d /tmp/esbx-dist.XXXXXX)
chmod 755 "$work"

cd "$src"
echo "== make dist (twice: reproducible)"
make dist GO="$GO" >"$work/dist1.log"
cp dist/SHA256SUMS "$work/SHA256SUMS.1"
make dist GO="$GO" >"$work/dist2.log"
if ! cmp -s "$work/SHA256SUMS.1" dist/SHA256SUMS; then
	diff "$work/SHA256SUMS.1" dist/SHA256SUMS
	echo "make dist is not reproducible" >&2
	exit 1
fi
ls -l dist/
arch=$(dpkg --print-architecture)
deb=$(ls dist/ephemeral-sandbox_*_"$arch".deb)
rpmfile=$(ls dist/ephemeral-sandbox-*."$(uname -m)".rpm)
tar -tzf dist/ephemeral-sandbox_*_linux_arm64.tar.gz >"$work/arm64.list"
grep -q '/bin/sandbox-exec-shim$' "$work/arm64.list" || { echo "the arm64 archive lacks the C shim" >&2; exit 1; }

echo "== the .deb and the .rpm list the same files"
# Files only: the .deb also lists every parent directory, which it does not own alone.
dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./|/|' | sort >"$work/deb.regular"
# The one difference by design: zsh completions go where each family's zsh looks.
rpm -qlp "$rpmfile" 2>/dev/null | sed 's|/zsh/site-functions/|/zsh/vendor-completions/|' | sort >"$work/rpm.files"
diff "$work/deb.regular" "$work/rpm.files" || { echo ".deb and .rpm list different files" >&2; exit 1; }
cat "$work/deb.regular"

echo "== dpkg -i"
dpkg -i "$deb" >/dev/null 2>&1 || apt-get install -f -y -qq >/dev/null
dpkg -s ephemeral-sandbox | grep -q '^Status: install ok installed'
while read -r f; do test -e "$f" || { echo "missing after install: $f" >&2; exit 1; }; done <"$work/deb.regular"

echo "== the unit files, the AppArmor profile, the man page, the completions"
rt=$work/xdg-run && mkdir -m 700 "$rt"
out=$(XDG_RUNTIME_DIR=$rt systemd-analyze --user --man=no verify /usr/lib/systemd/user/ephemeral-sandbox.socket /usr/lib/systemd/user/ephemeral-sandbox.service 2>&1)
[ -z "$out" ] || { echo "$out" >&2; exit 1; }
grep -qx 'ExecStart=/usr/bin/sandbox-supervisor serve' /usr/lib/systemd/user/ephemeral-sandbox.service
profile=/etc/apparmor.d/sandbox-supervisor
if [ -e /etc/apparmor.d/abi/4.0 ]; then
	apparmor_parser -Q --skip-kernel-load "$profile"
else
	# AppArmor 3 (Debian 12) cannot parse abi 4.0 nor the userns rule:
	# check that these are the only lines it cannot take, and the rest.
	[ "$(grep -cE '^abi <abi/4\.0>,$|^  userns,$' "$profile")" = 2 ]
	sed -e 's|^abi <abi/4\.0>,$|abi <abi/3.0>,|' -e '/^  userns,$/d' "$profile" >"$work/profile-abi3"
	apparmor_parser -Q --skip-kernel-load "$work/profile-abi3"
	test -L /etc/apparmor.d/disable/sandbox-supervisor # the boot-time load skips it
fi
# (captured first: grep -q closing a pipe early would fail it under pipefail)
page=$(man sandbox-runtime-cli 2>/dev/null)
grep -q 'exec_command' <<<"$page"
page=$(man sandbox-supervisor 2>/dev/null)
grep -q 'setup' <<<"$page"

echo "== a fresh user with an empty home: setup, the demo from /usr/bin, completions"
useradd -M -d /home/$pkguser -s /bin/bash $pkguser
install -d -o $pkguser -g $pkguser -m 0700 /home/$pkguser
su - $pkguser -c 'sandbox-supervisor setup; sandbox-supervisor setup' >"$work/setup.log" 2>&1 || true
cat "$work/setup.log"
grep -q 'autostart\|enabled and started' "$work/setup.log"
grep -q '^console: ' "$work/setup.log"
# setup wrote nothing (no user manager here: nothing to enable).
[ -z "$(find /home/$pkguser -mindepth 1 -print -quit)" ] || { find /home/$pkguser; echo "setup wrote files" >&2; exit 1; }
cat >"$work/complete.sh" <<'SH'
source /usr/share/bash-completion/bash_completion
source /usr/share/bash-completion/completions/sandbox-runtime-cli
complete -p sandbox-runtime-cli >/dev/null
COMP_WORDS=(sandbox-runtime-cli exec_); COMP_CWORD=1; COMP_LINE="sandbox-runtime-cli exec_"; COMP_POINT=${#COMP_LINE}
__start_sandbox-runtime-cli sandbox-runtime-cli exec_ sandbox-runtime-cli 2>/dev/null
printf '%s\n' "${COMPREPLY[@]}"
SH
chmod 644 "$work/complete.sh"
offered=$(su - $pkguser -c "bash $work/complete.sh")
grep -qx exec_command <<<"$offered" || { echo "bash completion of sandbox-runtime-cli exec_ does not offer exec_command" >&2; exit 1; }
cp scripts/demo.sh "$work/demo.sh" && chmod 755 "$work/demo.sh"
su - $pkguser -c "DEMO_BIN=/usr/bin $work/demo.sh" >"$work/demo.log" 2>&1 || { tail -40 "$work/demo.log"; exit 1; }
tail -4 "$work/demo.log"
grep -q '^destroyed' "$work/demo.log"

echo "== dpkg -r removes every file of the package (the AppArmor conffile until purge)"
dpkg -r ephemeral-sandbox >/dev/null
while read -r f; do
	if [ -e "$f" ] && [ "$f" != "$profile" ]; then echo "left after dpkg -r: $f" >&2; exit 1; fi
done <"$work/deb.regular"
dpkg -P ephemeral-sandbox >/dev/null
while read -r f; do
	if [ -e "$f" ]; then echo "left after dpkg -P: $f" >&2; exit 1; fi
done <"$work/deb.regular"
test ! -e /etc/apparmor.d/disable/sandbox-supervisor
echo "dist: ok"
