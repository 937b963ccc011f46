#!/bin/sh
# ephemeral-sandbox postinst (deb: configure; rpm: %post). Loads the
# AppArmor profile where AppArmor is active and new enough for it (abi 4.0:
# the userns rule; that is where unprivileged user namespaces may be
# restricted); on an older AppArmor (Debian 12: 3.0) the profile is listed
# in /etc/apparmor.d/disable so that the boot-time load skips a profile it
# cannot parse. Touches nothing in users' homes.
set -e
profile=/etc/apparmor.d/sandbox-supervisor
if [ -e /etc/apparmor.d/abi/4.0 ]; then
	rm -f /etc/apparmor.d/disable/sandbox-supervisor
	if command -v aa-enabled >/dev/null 2>&1 && aa-enabled --quiet 2>/dev/null && command -v apparmor_parser >/dev/null 2>&1; then
		apparmor_parser --replace --write-cache "$profile" ||
			echo "ephemeral-sandbox: could not load the AppArmor profile $profile" >&2
	fi
elif [ -d /etc/apparmor.d/disable ]; then
	ln -sf "$profile" /etc/apparmor.d/disable/sandbox-supervisor
fi
echo "ephemeral-sandbox: each user runs once: sandbox-supervisor setup"
exit 0
