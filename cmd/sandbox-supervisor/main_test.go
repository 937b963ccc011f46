package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHelpListsEverySubcommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		for _, c := range subcommands() {
			if !strings.Contains(out.String(), "  "+c.name+" ") {
				t.Errorf("%v does not list %s:\n%s", args, c.name, out.String())
			}
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "frobnicate"`) || !strings.Contains(errb.String(), "setup") {
		t.Errorf("unknown command: exit %d, stderr %q", code, errb.String())
	}
}

func TestPackageFiles(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run([]string{"package-files", dir}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	svc, err := os.ReadFile(filepath.Join(dir, "systemd", "user", "ephemeral-sandbox.service"))
	if err != nil || !strings.Contains(string(svc), "\nExecStart=/usr/bin/sandbox-supervisor serve\n") {
		t.Errorf("service unit: %v\n%s", err, svc)
	}
	sock, err := os.ReadFile(filepath.Join(dir, "systemd", "user", "ephemeral-sandbox.socket"))
	if err != nil || !strings.Contains(string(sock), "\nListenStream=%t/ephemeral-sandbox/supervisor.sock\n") {
		t.Errorf("socket unit: %v\n%s", err, sock)
	}
	man, err := os.ReadFile(filepath.Join(dir, "man", "man1", "sandbox-supervisor.1"))
	if err != nil || !strings.HasPrefix(string(man), ".TH SANDBOX-SUPERVISOR 1 ") || !strings.Contains(string(man), ".SS setup") {
		t.Errorf("man page: %v\n%s", err, man)
	}
	if code := run([]string{"package-files", "relative"}, &out, &errb); code != 2 {
		t.Errorf("relative directory: exit %d", code)
	}
}
