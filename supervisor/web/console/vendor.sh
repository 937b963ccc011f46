#!/bin/sh
# Copies the prebuilt dist files of the console's libraries from node_modules
# (installed by `npm ci` from package-lock.json) into assets/vendor, with their
# licenses, and writes assets/vendor/MANIFEST: "package version sha256 file"
# per file. vendor_test.go checks MANIFEST against package-lock.json and the
# files, so a hand-edited or stale vendor tree fails CI. Run by `make ui`.
set -eu
cd "$(dirname "$0")"
out=assets/vendor
rm -rf "$out"
mkdir -p "$out"
copy() { # package file...
	pkg=$1
	shift
	ver=$(node -p "require('./node_modules/$pkg/package.json').version")
	dir="$out/$(echo "$pkg" | tr -d @ | tr / -)"
	mkdir -p "$dir"
	for f in "$@"; do
		cp "node_modules/$pkg/$f" "$dir/"
		echo "$pkg $ver $(sha256sum "$dir/$(basename "$f")" | cut -d' ' -f1) ${dir#$out/}/$(basename "$f")" >>"$out/MANIFEST.tmp"
	done
}
copy @xterm/xterm lib/xterm.mjs css/xterm.css LICENSE
copy @xterm/addon-fit lib/addon-fit.mjs LICENSE
copy diff2html bundles/js/diff2html.min.js bundles/css/diff2html.min.css LICENSE.md
copy uplot dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE
sort -k4 "$out/MANIFEST.tmp" >"$out/MANIFEST"
rm "$out/MANIFEST.tmp"
echo "vendored into $out:"
cat "$out/MANIFEST"
