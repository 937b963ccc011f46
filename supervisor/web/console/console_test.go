package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	notFound := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := Handler(notFound)
	for _, tc := range []struct {
		path   string
		status int
		ctype  string
	}{
		{"/", 200, "text/html; charset=utf-8"},
		{"/app/main.js", 200, "text/javascript; charset=utf-8"},
		{"/app/style.css", 200, "text/css; charset=utf-8"},
		{"/vendor/xterm-xterm/xterm.mjs", 200, "text/javascript; charset=utf-8"},
		{"/vendor/MANIFEST", 200, "text/plain; charset=utf-8"},
		{"/vendor/", http.StatusTeapot, ""},
		{"/app", http.StatusTeapot, ""},
		{"/app/nope.js", http.StatusTeapot, ""},
		{"/app/../index.html", 200, "text/html; charset=utf-8"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
		if rec.Code != tc.status || rec.Header().Get("Content-Type") != tc.ctype {
			t.Errorf("GET %s: %d %q, want %d %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.status, tc.ctype)
		}
	}
}

// TestReferencesResolve: every file index.html loads and every module a
// script imports is embedded, so a renamed file or a typo in an import
// fails here rather than as a blank page.
func TestReferencesResolve(t *testing.T) {
	files := Assets()
	refs := regexp.MustCompile(`(?:src|href)="(/[^"]+)"|from '([^']+)'|import\('([^']+)'\)`)
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "vendor/") || !(strings.HasSuffix(p, ".html") || strings.HasSuffix(p, ".js")) {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		n := 0
		for _, m := range refs.FindAllStringSubmatch(string(b), -1) {
			ref := m[1] + m[2] + m[3]
			target := strings.TrimPrefix(ref, "/")
			if !strings.HasPrefix(ref, "/") {
				target = path.Join(path.Dir(p), ref)
			}
			if _, err := fs.Stat(files, target); err != nil {
				t.Errorf("%s refers to %s, which is not embedded", p, ref)
			}
			n++
		}
		if p == "index.html" && n < 5 {
			t.Errorf("index.html: found only %d references", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
