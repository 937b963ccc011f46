#!/bin/sh
# ephemeral-sandbox prerm (deb: remove/upgrade; rpm: %preun, $1 = 0 on
# erase). Unloads the AppArmor profile on removal; user data, user units'
# enablement links and running supervisors are left alone.
set -e
case "$1" in
remove | 0)
	if command -v aa-enabled >/dev/null 2>&1 && aa-enabled --quiet 2>/dev/null &&
		command -v apparmor_parser >/dev/null 2>&1 && [ -e /etc/apparmor.d/sandbox-supervisor ]; then
		apparmor_parser --remove /etc/apparmor.d/sandbox-supervisor >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
