// Package console holds the browser console's pages: plain ES modules, CSS
// and the vendored libraries' prebuilt dist files (assets/vendor, written by
// `make ui` from package-lock.json), embedded into the supervisor binary so
// the console works offline and needs no Node at build time. The web package
// serves them behind the UI token; everything the pages show comes from
// POST /api/rpc and the SSE streams.
//
// It must never load anything from outside the listener or run inline script.
package console

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var embedded embed.FS

// Assets is the asset tree (index.html at its root).
func Assets() fs.FS {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		// The embed pattern above guarantees the directory exists.
		panic(err)
	}
	return sub
}

// contentTypes are set explicitly: the host's mime tables may lack .mjs,
// and X-Content-Type-Options: nosniff makes the browser refuse a module
// script served with the wrong type.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".md":   "text/plain; charset=utf-8",
	"":      "text/plain; charset=utf-8", // LICENSE, MANIFEST
}

// Handler serves the assets: "/" is index.html, other paths their file;
// directories and unknown files are 404 (the caller's not-found handler).
func Handler(notFound http.Handler) http.Handler {
	files := Assets()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/")
		if name == "" {
			name = "index.html"
		}
		b, err := fs.ReadFile(files, name)
		if err != nil {
			notFound.ServeHTTP(w, r)
			return
		}
		ext := path.Ext(name)
		ct, ok := contentTypes[ext]
		if !ok {
			if ct = mime.TypeByExtension(ext); ct == "" {
				ct = "application/octet-stream"
			}
		}
		w.Header().Set("Content-Type", ct)
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(b)
	})
}
