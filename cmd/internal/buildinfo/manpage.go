package buildinfo

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ManSection is one part of a man page: a section heading (.SH), or with
// Sub a subsection (.SS) of the last heading; Text is shown as written
// (no filling), as the binaries' own help is.
type ManSection struct {
	Heading, Sub, Text string
}

// ManPage renders a section 1 man page in roff (man(7) macros).
func ManPage(name, summary, version string, date time.Time, sections ...ManSection) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, ".TH %s 1 %q %q \"User Commands\"\n", strings.ToUpper(name), date.UTC().Format("2006-01-02"), "ephemeral-sandbox "+version)
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", roffEscape(name), roffEscape(summary))
	for _, s := range sections {
		if s.Heading != "" {
			fmt.Fprintf(&b, ".SH %s\n", strings.ToUpper(roffEscape(s.Heading)))
		}
		if s.Sub != "" {
			fmt.Fprintf(&b, ".SS %s\n", roffEscape(s.Sub))
		}
		if t := strings.Trim(s.Text, "\n"); t != "" {
			b.WriteString(".nf\n")
			for _, l := range strings.Split(t, "\n") {
				l = roffEscape(l)
				if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
					l = `\&` + l // not a request
				}
				b.WriteString(l + "\n")
			}
			b.WriteString(".fi\n")
		}
	}
	return []byte(b.String())
}

func roffEscape(s string) string {
	return strings.NewReplacer(`\`, `\e`, "-", `\-`).Replace(s)
}

// ManDate is the date a man page shows: SOURCE_DATE_EPOCH when set (make
// dist: the same bytes from the same commit), else today.
func ManDate() time.Time {
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.Unix(n, 0)
		}
	}
	return time.Now()
}
