package catalog

import (
	"encoding/json"
	"io"
	"math"
	"math/big"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Args are validated, typed arguments: strings are string, Integers uint64,
// Floats float64, Booleans bool and JsonArrays []any.
type Args map[string]any

// String returns a string argument, "" when absent.
func (a Args) String(name string) string { s, _ := a[name].(string); return s }

// Has reports whether the argument was given or defaulted.
func (a Args) Has(name string) bool { _, ok := a[name]; return ok }

// Uint returns an Integer argument, 0 when absent.
func (a Args) Uint(name string) uint64 { v, _ := a[name].(uint64); return v }

// Float returns a Float argument, 0 when absent.
func (a Args) Float(name string) float64 { v, _ := a[name].(float64); return v }

// Bool returns a Boolean argument, false when absent.
func (a Args) Bool(name string) bool { v, _ := a[name].(bool); return v }

// Array returns a JsonArray argument, nil when absent.
func (a Args) Array(name string) []any { v, _ := a[name].([]any); return v }

// ValidID reports whether s satisfies the contract's rule for client-sent IDs:
// 1 to 128 characters of [A-Za-z0-9._:-]. It is a loop, not the regexp
// ^[A-Za-z0-9._:-]{1,128}$: compiling that repetition at package init cost
// every CLI start about 1 ms of CPU (128 nested instructions).
func ValidID(s string) bool {
	if len(s) < 1 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// Validate checks raw arguments against the declaration and returns them
// typed, with defaults applied. Every failure is an invalid_request with the
// contract's wording (§2.6). A JSON null counts as absent.
func (op *Op) Validate(raw map[string]any) (Args, *Error) {
	names := make([]string, 0, len(raw))
	for k := range raw {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if op.Arg(k) == nil {
			return nil, Errorf(InvalidRequest, "unknown argument for %s: %s", op.ID, k)
		}
	}
	out := Args{}
	for i := range op.Args {
		a := &op.Args[i]
		v, present := raw[a.Name]
		if v == nil {
			present = false
		}
		if !present {
			if a.Required {
				return nil, Errorf(InvalidRequest, "%s is required for %s", a.Name, op.ID)
			}
			if a.Default != nil {
				out[a.Name] = a.Default
			}
			continue
		}
		tv, err := a.check(v)
		if err != nil {
			return nil, err
		}
		out[a.Name] = tv
	}
	return out, nil
}

func (a *Arg) check(v any) (any, *Error) {
	switch a.Kind {
	case String, Path:
		s, ok := v.(string)
		if !ok {
			return nil, Errorf(InvalidRequest, "%s must be a string", a.Name)
		}
		// A request line never carries such a string (ParseLine refuses it);
		// this is for clients, whose JSON encoder would otherwise send
		// U+FFFD in place of what the user typed.
		if !utf8.ValidString(s) {
			return nil, Errorf(InvalidRequest, "%s must be valid UTF-8", a.Name)
		}
		return s, a.checkString(s)
	case Integer:
		n, ok := toUint(v)
		if !ok {
			return nil, Errorf(InvalidRequest, "%s must be an unsigned integer", a.Name)
		}
		return a.checkUint(n)
	case Float:
		f, ok := toFloat(v)
		if !ok {
			return nil, Errorf(InvalidRequest, "%s must be a finite number", a.Name)
		}
		switch {
		case a.FMin != nil && f < *a.FMin && a.FMax != nil, a.FMax != nil && f > *a.FMax && a.FMin != nil:
			return nil, Errorf(InvalidRequest, "%s must be between %g and %g", a.Name, *a.FMin, *a.FMax)
		case a.FMin != nil && f < *a.FMin:
			return nil, Errorf(InvalidRequest, "%s must be at least %g", a.Name, *a.FMin)
		case a.FMax != nil && f > *a.FMax:
			return nil, Errorf(InvalidRequest, "%s must be at most %g", a.Name, *a.FMax)
		}
		return f, nil
	case Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, Errorf(InvalidRequest, "%s must be a boolean", a.Name)
		}
		return b, nil
	case JSONArray:
		arr, ok := v.([]any)
		if !ok && a.AcceptJSONString {
			if s, isStr := v.(string); isStr {
				d := json.NewDecoder(strings.NewReader(s))
				d.UseNumber()
				if d.Decode(&arr) == nil {
					if _, err := d.Token(); err == io.EOF {
						ok = arr != nil
					}
				}
			}
		}
		if !ok {
			return nil, Errorf(InvalidRequest, "%s must be an array", a.Name)
		}
		if a.MaxItems > 0 && len(arr) > a.MaxItems {
			return nil, Errorf(InvalidRequest, "%s must have at most %d items", a.Name, a.MaxItems)
		}
		if err := a.CheckItems(arr, false); err != nil {
			return nil, err
		}
		return arr, nil
	}
	return nil, Errorf(InternalError, "argument %s has an unknown kind", a.Name)
}

// CheckItems checks the elements of an array argument against its Items
// declaration. strict makes a JSON null field a type error (the MCP schema
// says so); otherwise null counts as absent, as for top-level arguments.
func (a *Arg) CheckItems(arr []any, strict bool) *Error {
	it := a.Items
	if it == nil {
		return nil
	}
	for i, v := range arr {
		if len(it.Fields) == 0 {
			if _, ok := v.(string); !ok {
				return Errorf(InvalidRequest, "%s[%d] must be a string", a.Name, i)
			}
			continue
		}
		m, ok := v.(map[string]any)
		if !ok {
			return Errorf(InvalidRequest, "%s[%d] must be an object %s", a.Name, i, it.Shape())
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			known := false
			for _, f := range it.Fields {
				known = known || f.Name == k
			}
			if !known {
				return Errorf(InvalidRequest, "%s[%d] has an unknown field: %s", a.Name, i, k)
			}
		}
		for _, f := range it.Fields {
			fv, present := m[f.Name]
			if fv == nil && !strict {
				present = false
			}
			if !present {
				if f.Required {
					return Errorf(InvalidRequest, "%s[%d].%s is required", a.Name, i, f.Name)
				}
				continue
			}
			if err := f.check(fv); err != "" {
				return Errorf(InvalidRequest, "%s[%d].%s %s", a.Name, i, f.Name, err)
			}
		}
	}
	return nil
}

// check returns what is wrong with a field value ("" when nothing).
func (f *Field) check(v any) string {
	switch f.Kind {
	case String, Path:
		s, ok := v.(string)
		if !ok {
			return "must be a string"
		}
		if len(f.Enum) > 0 && !slices.Contains(f.Enum, s) {
			return "must be one of " + strings.Join(f.Enum, ", ")
		}
	case Integer:
		if _, ok := toUint(v); !ok {
			return "must be an unsigned integer"
		}
	case Float:
		if _, ok := toFloat(v); !ok {
			return "must be a finite number"
		}
	case Boolean:
		if _, ok := v.(bool); !ok {
			return "must be a boolean"
		}
	}
	return ""
}

func (a *Arg) checkString(s string) *Error {
	if a.ID && !ValidID(s) {
		return Errorf(InvalidRequest, "%s must match [A-Za-z0-9._:-]{1,128}", a.Name)
	}
	if a.NonEmpty && strings.TrimSpace(s) == "" {
		return Errorf(InvalidRequest, "%s must be non-empty", a.Name)
	}
	if a.MaxLen > 0 && utf8.RuneCountInString(s) > a.MaxLen {
		return Errorf(InvalidRequest, "%s must be at most %d characters", a.Name, a.MaxLen)
	}
	if a.NoControl && strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return Errorf(InvalidRequest, "%s must not contain control characters", a.Name)
	}
	if len(a.Enum) > 0 {
		for _, e := range a.Enum {
			if s == e {
				return nil
			}
		}
		return Errorf(InvalidRequest, "%s must be one of %s", a.Name, strings.Join(a.Enum, ", "))
	}
	return nil
}

func (a *Arg) checkUint(n uint64) (uint64, *Error) {
	if a.Min != nil && n < *a.Min {
		if a.ClampMin {
			return *a.Min, nil
		}
		return 0, a.rangeError()
	}
	if a.Max != nil && n > *a.Max {
		if a.ClampMax {
			return *a.Max, nil
		}
		return 0, a.rangeError()
	}
	return n, nil
}

func (a *Arg) rangeError() *Error {
	switch {
	case a.Min != nil && a.Max != nil:
		return RangeError(a.Name, *a.Min, *a.Max)
	case a.Min != nil:
		return Errorf(InvalidRequest, "%s must be at least %d", a.Name, *a.Min)
	default:
		return Errorf(InvalidRequest, "%s must be at most %d", a.Name, *a.Max)
	}
}

// RangeError is the invalid_request for an integer outside [lo, hi]; handlers
// use it for limits that come from configuration.
func RangeError(name string, lo, hi uint64) *Error {
	return Errorf(InvalidRequest, "%s must be between %d and %d", name, lo, hi)
}

func toUint(v any) (uint64, bool) {
	switch n := v.(type) {
	case json.Number:
		if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
			return u, true
		}
		return integralNumber(string(n))
	case uint64:
		return n, true
	case int:
		return uint64(n), n >= 0
	case int64:
		return uint64(n), n >= 0
	case float64:
		if n < 0 || n != math.Trunc(n) || n >= 1<<64 {
			return 0, false
		}
		return uint64(n), true
	}
	return 0, false
}

// integralNumber accepts a JSON number with a fraction or exponent whose
// value is a whole number that fits uint64 ("2.0", "1e3"): JSON Schema's
// integer type allows them and clients written in languages with one number
// type send them. The exponent is bounded so a hostile "1e999999999" cannot
// make big.Rat allocate without limit.
func integralNumber(s string) (uint64, bool) {
	if !integralForm().MatchString(s) {
		return 0, false
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok || !r.IsInt() || !r.Num().IsUint64() {
		return 0, false
	}
	return r.Num().Uint64(), true
}

// integralForm is compiled on first use, not at every client's start.
var integralForm = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]{1,3})?$`)
})

func toFloat(v any) (float64, bool) {
	var f float64
	switch n := v.(type) {
	case json.Number:
		var err error
		f, err = strconv.ParseFloat(string(n), 64)
		if err != nil {
			return 0, false
		}
	case float64:
		f = n
	case uint64:
		f = float64(n)
	case int:
		f = float64(n)
	default:
		return 0, false
	}
	return f, !math.IsInf(f, 0) && !math.IsNaN(f)
}
