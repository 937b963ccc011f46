package images

import (
	"path/filepath"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// Source kinds of an image argument.
const (
	srcEngine        = "engine"
	srcDockerArchive = "docker-archive"
	srcOCIArchive    = "oci-archive"
)

type source struct {
	kind  string
	value string // a reference or sha256 ID for the engine, else the archive path
}

var imageIDRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// parseSource checks an image argument other than "host" (§3.2).
func parseSource(arg string) (source, error) {
	for _, k := range []string{srcDockerArchive, srcOCIArchive} {
		if p, ok := strings.CutPrefix(arg, k+":"); ok {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				return source{}, errorf(BadInput, arg, "malformed_reference", "image %q: the archive path must be absolute and clean", arg)
			}
			return source{kind: k, value: p}, nil
		}
	}
	if strings.HasPrefix(arg, "sha256:") {
		if !imageIDRe.MatchString(arg) {
			return source{}, errorf(BadInput, arg, "malformed_reference", "image %q: an image ID is sha256: and 64 lowercase hex digits", arg)
		}
		return source{kind: srcEngine, value: arg}, nil
	}
	if _, err := reference.ParseNormalizedNamed(arg); err != nil {
		return source{}, errorf(BadInput, arg, "malformed_reference", "image %q is not a valid Docker reference: %v", arg, err)
	}
	return source{kind: srcEngine, value: arg}, nil
}
