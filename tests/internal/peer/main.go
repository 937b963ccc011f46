// Command peer is the second local user's side of the runtime-directory
// tests (tests/squat_test.go, TestOtherUserRefused). The tests run it with
// `sudo -n -u $ESBX_OTHER_USER`.
//
//	peer squat [-listen] [-link-log TARGET] DIR
//	    makes DIR (mode 0755) as a squatter would, optionally listens on
//	    DIR/supervisor.sock (mode 0666) answering every request with a
//	    forged success, and optionally plants DIR/supervisor.log -> TARGET.
//	    It prints "ready" once set up; when its stdin closes it removes
//	    what it made and prints "conns C bytes B": the connections it
//	    accepted and the request bytes it received.
//	peer send SOCKET LINE
//	    sends LINE and a newline on SOCKET and prints the one answer line.
//	peer http URL [BODY] [TOKENFILE]
//	    GETs URL (POSTs BODY as application/json when given; with
//	    TOKENFILE, presents its content as the Bearer token, or the read
//	    error) and prints "STATUS BODY".
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: peer squat [-listen] [-link-log TARGET] DIR | peer send SOCKET LINE")
	}
	switch os.Args[1] {
	case "squat":
		squat(os.Args[2:])
	case "send":
		if len(os.Args) != 4 {
			fail("usage: peer send SOCKET LINE")
		}
		send(os.Args[2], os.Args[3])
	case "http":
		if len(os.Args) < 3 || len(os.Args) > 5 {
			fail("usage: peer http URL [BODY] [TOKENFILE]")
		}
		httpReq(os.Args[2:])
	default:
		fail("unknown mode " + os.Args[1])
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "peer:", msg)
	os.Exit(2)
}

func squat(args []string) {
	fs := flag.NewFlagSet("squat", flag.ExitOnError)
	listen := fs.Bool("listen", false, "listen on DIR/supervisor.sock")
	linkLog := fs.String("link-log", "", "plant DIR/supervisor.log as a symlink to this path")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		fail("squat needs DIR")
	}
	dir := fs.Arg(0)
	if err := os.Mkdir(dir, 0o755); err != nil {
		fail(err.Error())
	}
	defer os.RemoveAll(dir)
	// Open enough that the victim can reach what is inside.
	if err := os.Chmod(dir, 0o755); err != nil {
		fail(err.Error())
	}
	if *linkLog != "" {
		if err := os.Symlink(*linkLog, filepath.Join(dir, "supervisor.log")); err != nil {
			fail(err.Error())
		}
	}
	var mu sync.Mutex
	var handlers sync.WaitGroup
	conns, total := 0, 0
	var ln net.Listener
	accepting := make(chan struct{})
	if *listen {
		sock := filepath.Join(dir, "supervisor.sock")
		var err error
		if ln, err = net.Listen("unix", sock); err != nil {
			fail(err.Error())
		}
		if err := os.Chmod(sock, 0o666); err != nil {
			fail(err.Error())
		}
		go func() {
			defer close(accepting)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns++
				mu.Unlock()
				handlers.Go(func() {
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					line, _ := bufio.NewReader(c).ReadBytes('\n')
					mu.Lock()
					total += len(line)
					mu.Unlock()
					if len(line) > 0 {
						_, _ = c.Write([]byte(`{"forged":true,"sandboxes":[]}` + "\n"))
					}
				})
			}
		}()
	} else {
		close(accepting)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if ln != nil {
		ln.Close()
	}
	<-accepting
	handlers.Wait()
	fmt.Printf("conns %d bytes %d\n", conns, total)
}

func send(sock, line string) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fail(err.Error())
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	// The supervisor may answer and close before reading (unauthorized):
	// the answer is what counts, not whether the write went through.
	_, _ = c.Write([]byte(line + "\n"))
	resp, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && resp == "" {
		fail(err.Error())
	}
	fmt.Print(resp)
}

func httpReq(args []string) {
	method, body := http.MethodGet, ""
	if len(args) > 1 && args[1] != "" {
		method, body = http.MethodPost, args[1]
	}
	req, err := http.NewRequest(method, args[0], strings.NewReader(body))
	if err != nil {
		fail(err.Error())
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	if len(args) > 2 {
		tok, err := os.ReadFile(args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "token file:", err)
		} else {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		}
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		fail(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s", resp.StatusCode, b)
}
