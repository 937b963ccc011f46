package cli

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/pflag"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// argValue is the pflag.Value behind every operation flag: it records the
// raw text; the kind conversion happens after parsing (ConvertFlag) so that
// every error carries the contract's wording.
type argValue struct {
	arg *catalog.Arg
	set bool
	val string
}

func (v *argValue) String() string { return v.val }
func (v *argValue) Type() string   { return strings.ToLower(v.arg.Kind.String()) }
func (v *argValue) Set(s string) error {
	v.set, v.val = true, s
	return nil
}

// addArgFlags registers the flags of op's non-positional arguments (name,
// then aliases, sharing one value) and returns the values by argument name.
func addArgFlags(fs *pflag.FlagSet, op *catalog.Op) map[string]*argValue {
	vals := map[string]*argValue{}
	for i := range op.Args {
		a := &op.Args[i]
		if a.Positional != "" {
			continue
		}
		v := &argValue{arg: a}
		vals[a.Name] = v
		for j, name := range append([]string{a.FlagName()}, a.FlagAliases...) {
			usage := a.Help
			if j > 0 {
				usage = "alias of --" + a.FlagName()
			}
			fs.Var(v, name, usage)
			if a.Kind == catalog.Boolean {
				fs.Lookup(name).NoOptDefVal = "true"
			}
		}
	}
	return vals
}

var (
	// Compiled on first use: most calls never parse a number.
	decimalDigits = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]+$`) })
	decimalFloat  = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$`)
	})
)

// ConvertFlag turns the text of a flag or positional into the JSON value of
// the argument's kind (§2.6): String/Path as is, Integer decimal digits,
// Float a finite decimal, Boolean true|false, JsonArray JSON text of an
// array. Limits, enums and defaults are left to op.Validate.
func ConvertFlag(a *catalog.Arg, text string) (any, *catalog.Error) {
	switch a.Kind {
	case catalog.String, catalog.Path:
		return text, nil
	case catalog.Integer:
		if decimalDigits().MatchString(text) {
			if n, err := strconv.ParseUint(text, 10, 64); err == nil {
				return n, nil
			}
		}
		return nil, catalog.Errorf(catalog.InvalidRequest, "%s must be an unsigned integer", a.Name)
	case catalog.Float:
		if decimalFloat().MatchString(text) {
			if f, err := strconv.ParseFloat(text, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				return f, nil
			}
		}
		return nil, catalog.Errorf(catalog.InvalidRequest, "%s must be a finite number", a.Name)
	case catalog.Boolean:
		switch text {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, catalog.Errorf(catalog.InvalidRequest, "%s must be a boolean", a.Name)
	case catalog.JSONArray:
		d := json.NewDecoder(bytes.NewReader([]byte(text)))
		d.UseNumber()
		var arr []any
		if err := d.Decode(&arr); err != nil || arr == nil || d.More() {
			return nil, catalog.Errorf(catalog.InvalidRequest, "%s must be an array", a.Name)
		}
		return arr, nil
	}
	return nil, catalog.Errorf(catalog.InternalError, "argument %s has an unknown kind", a.Name)
}

// StrictJSONKind checks that a JSON value decoded with UseNumber has the
// JSON type the MCP schema declares for the argument's kind; null is a
// type error there. The message is the contract's (§2.6).
func StrictJSONKind(a *catalog.Arg, v any) *catalog.Error {
	ok := false
	msg := ""
	switch a.Kind {
	case catalog.String, catalog.Path:
		_, ok = v.(string)
		msg = "must be a string"
	case catalog.Integer:
		_, ok = v.(json.Number)
		msg = "must be an unsigned integer"
	case catalog.Float:
		_, ok = v.(json.Number)
		msg = "must be a finite number"
	case catalog.Boolean:
		_, ok = v.(bool)
		msg = "must be a boolean"
	case catalog.JSONArray:
		_, ok = v.([]any)
		msg = "must be an array"
	}
	if !ok {
		return catalog.Errorf(catalog.InvalidRequest, "%s %s", a.Name, msg)
	}
	return nil
}
