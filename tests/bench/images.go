package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// benchImage is the image of part 5 (ESBX_BENCH_IMAGE overrides it); the
// default is the busybox test image .ci/docker.sh builds.
func benchImage() string {
	if v := os.Getenv("ESBX_BENCH_IMAGE"); v != "" {
		return v
	}
	return "esbx-test/busybox:1"
}

// imageCreation (part 5) measures create_sandbox from a Docker image with a
// cold cache (export + unpack) and a warm one (cached rootfs), plus a first
// command in the image, beside `docker run --rm IMAGE true` on the same Engine.
func (b *bench) imageCreation() {
	image := benchImage()
	out, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{.Id}}", image).CombinedOutput()
	if err != nil {
		b.printf("skipped: no Docker Engine with %s (sudo .ci/docker.sh $USER): %s\n", image, oneLine(string(out)))
		return
	}
	id := strings.TrimSpace(string(out))
	entry := filepath.Join(b.home, "data", "images", strings.TrimPrefix(id, "sha256:"))
	tree := filepath.Join(b.root, "image-tree")
	check(generateTree(tree, 10))

	create := func() (string, time.Duration) {
		res, d, err := b.timedCall("create_sandbox", "", map[string]any{"workspace_root": tree, "image": image})
		check(err)
		return res["id"].(string), d
	}
	var cold, warm, host, exec1, docker []time.Duration
	for i := 0; i <= b.cfg.reps; i++ { // i == 0 is the warm-up
		// Cold: the unreferenced cache entry is removed first (the cache reads its state from disk).
		check(removeAll(entry))
		sbx, dc := create()
		res, de, err := b.timedCall("exec_command", sbx, map[string]any{"cmd": "true"})
		check(err)
		check(execOK(res))
		sbx2, dw := create()
		b.destroySandbox(sbx)
		b.destroySandbox(sbx2)
		hres, dh, err := b.timedCall("create_sandbox", "", map[string]any{"workspace_root": tree})
		check(err)
		b.destroySandbox(hres["id"].(string))
		dd, err := timed(func() error { return runCmd("", "docker", "run", "--rm", "--network", "none", image, "true") })
		check(err)
		if i > 0 {
			cold, warm, host, exec1, docker = append(cold, dc), append(warm, dw), append(host, dh), append(exec1, de), append(docker, dd)
		}
	}
	tw := b.table(tabwriter.AlignRight)
	fmt.Fprintln(tw, "image\tcreate_sandbox first (export+unpack)\tcreate_sandbox cached\tcreate_sandbox host\tfirst exec true\tdocker run --rm true\tdocker/first\tdocker/cached\t")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", image, ms(median(cold)), ms(median(warm)), ms(median(host)), ms(median(exec1)),
		ms(median(docker)), ratio(median(docker), median(cold)), ratio(median(docker), median(warm)))
	tw.Flush()
	b.println("a 10-file workspace; first exec = an implicit session (holder + image root overlay + command + publish) in the cold sandbox")
}
