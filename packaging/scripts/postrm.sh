#!/bin/sh
# ephemeral-sandbox postrm (deb: remove/purge; rpm: %postun, $1 = 0 on
# erase): drops the disable link postinst may have made. Never touches a
# user's data ($XDG_DATA_HOME/ephemeral-sandbox and the rest).
set -e
case "$1" in
remove | purge | 0)
	if [ -L /etc/apparmor.d/disable/sandbox-supervisor ]; then
		rm -f /etc/apparmor.d/disable/sandbox-supervisor
	fi
	;;
esac
exit 0
