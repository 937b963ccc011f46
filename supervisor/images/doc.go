// Package images owns the image → rootfs cache of the supervisor (contract
// §4.2 step 2, §4.3, §5.4, §13 images.*): it resolves an image argument of
// create_sandbox (a Docker reference or sha256 image ID through the local
// Docker Engine, or a docker-archive:/oci-archive: file), unpacks the
// image's layers once into <data>/images/<image-id-hex>/rootfs/, counts
// the sandboxes that use each cached rootfs and prunes unreferenced ones
// least-recently-used beyond images.cache_max_bytes. It also lists the
// Engine's images (list_docker_images).
//
// Layout of one cache entry (written in a staging directory
// images/.staging-<hex>-*, renamed into place only when complete, so a
// failure or a crash never leaves a half-extracted entry; leftovers are
// swept when the cache opens):
//
//	images/<hex>/image.json   {id, refs, env, working_dir, layers, bytes, created_at, last_used}
//	images/<hex>/rootfs/      the image's filesystem
//
// Unpacking (unpack.go) streams every layer through a filter before
// go.podman.io/storage/pkg/archive.UnpackLayer applies it (whiteouts,
// opaque directories, hardlinks): the filter rejects entries whose name or
// hardlink target is absolute or contains "..", skips device nodes (they
// cannot be created without privileges and a session has its own /dev),
// drops ownership (every file belongs to the user) and xattrs, clears
// setuid/setgid and gives directories u+rwx so the supervisor can always
// prune them (inside a session root owns every file and has
// CAP_DAC_OVERRIDE over them, so that changes nothing there).
//
// Decisions the contract leaves open:
//
//   - Error kinds: a malformed reference, a missing/unreadable/non-tar
//     archive, an archive without exactly one image for this platform, and
//     an image absent while images.pull is "never" are BadInput
//     (invalid_request). An unreachable Engine is Unavailable
//     (operation_failed, details.docker "unavailable"). A failed pull or
//     export, a corrupt layer stream and a layer entry that would escape
//     the root are Failed (operation_failed, details.reason says which).
//   - A device node in a layer is skipped, not an error (§4.2 "skips
//     device nodes"); the unpack span reports how many were skipped.
//   - The image ID of an archive is sha256 of its config blob, as Docker
//     computes it, so an archive and the Engine image it was saved from
//     share one cache entry.
//   - WorkingDir is recorded in image.json but not applied: §5.4 says the
//     image's WorkingDir is ignored and commands start in /workspace.
//   - The default sockets ($XDG_RUNTIME_DIR/docker.sock, then
//     /var/run/docker.sock) are tried in that order when
//     images.docker_host and DOCKER_HOST are unset; the first that exists
//     is used.
package images
