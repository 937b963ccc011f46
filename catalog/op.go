package catalog

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is an argument's type (§2.6).
type Kind int

const (
	String Kind = iota
	Path
	Integer
	Float
	Boolean
	JSONArray
)

func (k Kind) String() string {
	switch k {
	case String:
		return "String"
	case Path:
		return "Path"
	case Integer:
		return "Integer"
	case Float:
		return "Float"
	case Boolean:
		return "Boolean"
	case JSONArray:
		return "JsonArray"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Group is the domain an operation belongs to; each has its own CLI and MCP set.
type Group string

const (
	Management    Group = "management"
	Runtime       Group = "runtime"
	Observability Group = "observability"
)

// Scope says which request scopes an operation accepts.
type Scope string

const (
	ScopeSystem          Scope = "system"
	ScopeSandbox         Scope = "sandbox"
	ScopeSystemOrSandbox Scope = "system|sandbox"
)

// Arg declares one argument.
type Arg struct {
	Name     string
	Kind     Kind
	Required bool
	// Default is applied by the server and shown by clients; nil means none.
	Default any
	// DefaultDoc replaces the rendered default in help and docs (e.g. when
	// the effective default comes from configuration).
	DefaultDoc string
	Help       string

	// Integer limits. Values outside [Min, Max] are refused unless the
	// matching Clamp flag says to clamp them.
	Min, Max           *uint64
	ClampMin, ClampMax bool
	// Float limits (inclusive).
	FMin, FMax *float64

	// String rules.
	Enum      []string
	MaxLen    int  // in characters; 0 = unbounded
	NonEmpty  bool // after trimming nothing is left → refused
	NoControl bool // control characters refused
	ID        bool // must match the contract's ID rule

	// MaxItems bounds a JsonArray; AcceptJSONString also takes a string
	// holding the JSON text of an array.
	MaxItems         int
	AcceptJSONString bool

	// Items declares the elements of a JsonArray. Every array argument
	// declares them: MCP clients refuse array schemas without items, and
	// validation checks each element against the same declaration.
	Items *Items

	// ClientSide arguments are applied by the clients (CLI, MCP) to the
	// response and never sent to the supervisor.
	ClientSide bool

	// CLI projection.
	Flag        string   // flag name without dashes; default: Name with _ → -
	FlagAliases []string // extra flag names
	Positional  string   // when set, the argument is this positional (e.g. COMMAND)
}

// Items describes the elements of a JsonArray argument: plain values of
// Kind (String or Path) when Fields is empty, else objects with exactly
// these fields.
type Items struct {
	Kind   Kind
	Fields []Field
}

// Field is one property of an array element object.
type Field struct {
	Name     string
	Kind     Kind // String, Path, Integer, Float or Boolean
	Required bool
	Enum     []string
	Default  any
	Help     string
}

// Shape renders the element shape for help and messages, e.g.
// "{old_string, new_string, replace_all?}" or "path strings".
func (it *Items) Shape() string {
	if it == nil {
		return "values"
	}
	if len(it.Fields) == 0 {
		return strings.ToLower(it.Kind.String()) + " strings"
	}
	parts := make([]string, 0, len(it.Fields))
	for _, f := range it.Fields {
		n := f.Name
		if !f.Required {
			n += "?"
		}
		parts = append(parts, n)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// FlagName is the CLI flag spelling of the argument.
func (a *Arg) FlagName() string {
	if a.Flag != "" {
		return a.Flag
	}
	b := []byte(a.Name)
	for i, c := range b {
		if c == '_' {
			b[i] = '-'
		}
	}
	return string(b)
}

// DefaultText renders the default for help and docs; "" means none.
func (a *Arg) DefaultText() string {
	if a.DefaultDoc != "" {
		return a.DefaultDoc
	}
	switch v := a.Default.(type) {
	case nil:
		return ""
	case string:
		return strconv.Quote(v)
	default:
		return fmt.Sprint(v)
	}
}

// LimitsText renders the argument's limits for help and docs.
func (a *Arg) LimitsText() string {
	s := ""
	add := func(t string) {
		if s != "" {
			s += "; "
		}
		s += t
	}
	if len(a.Enum) > 0 {
		e := ""
		for i, v := range a.Enum {
			if i > 0 {
				e += ", "
			}
			e += v
		}
		add("one of " + e)
	}
	switch {
	case a.Min != nil && a.Max != nil:
		add(fmt.Sprintf("%d..%d", *a.Min, *a.Max))
	case a.Min != nil:
		add(fmt.Sprintf("≥ %d", *a.Min))
	case a.Max != nil:
		add(fmt.Sprintf("≤ %d", *a.Max))
	}
	if a.ClampMax || a.ClampMin {
		add("clamped")
	}
	if a.FMin != nil && a.FMax != nil {
		add(fmt.Sprintf("%g..%g", *a.FMin, *a.FMax))
	}
	if a.MaxLen > 0 {
		add(fmt.Sprintf("≤ %d characters", a.MaxLen))
	}
	if a.NoControl {
		add("no control characters")
	}
	if a.NonEmpty {
		add("non-empty")
	}
	if a.ID {
		add("id rule")
	}
	if a.Items != nil {
		add("items " + a.Items.Shape())
		for _, f := range a.Items.Fields {
			if len(f.Enum) > 0 {
				add(f.Name + " one of " + strings.Join(f.Enum, ", "))
			}
		}
	}
	if a.MaxItems > 0 {
		add(fmt.Sprintf("≤ %d items", a.MaxItems))
	}
	return s
}

// Effect says what an operation does to state; MCP annotations, CLI help
// and docs derive from it.
type Effect int

const (
	// EffectUnknown is what an undeclared operation gets: treated as
	// destructive and not idempotent, so no client auto-approves it.
	EffectUnknown Effect = iota
	// ReadOnly operations change nothing.
	ReadOnly
	// Additive operations add state (a sandbox, a session) without
	// overwriting or discarding any.
	Additive
	// Destructive operations may overwrite or discard state.
	Destructive
)

func (e Effect) String() string {
	switch e {
	case ReadOnly:
		return "read-only"
	case Additive:
		return "additive"
	case Destructive:
		return "destructive"
	}
	return "unspecified (treated as destructive)"
}

// Op declares one public operation.
type Op struct {
	ID      string
	Group   Group
	Family  string
	Scope   Scope
	Title   string // human-readable name; default: from ID
	Summary string // one line
	Help    string // longer text
	Result  string // what a success returns
	// Output builds the exact JSON Schema (type object) of a success,
	// declared where the result is small and stable; nil where it is not
	// (command output, observability views). MCP sends it as the tool's
	// outputSchema. A builder, not a value: building every schema at
	// package init cost each CLI start about 1 ms of CPU.
	Output func() map[string]any
	Args   []Arg

	Effect Effect
	// Idempotent: repeating the call with the same arguments has no further
	// effect (read-only operations are idempotent by definition).
	Idempotent bool
	// OpenWorld: the operation reaches outside the supervisor's own state
	// (the network, a Docker registry, the host filesystem by path).
	OpenWorld bool

	// Streams: the operation sends progress lines when the request sets
	// _stream_logs (§2.5); the others never do.
	Streams bool
	// Span names the span of the whole operation (§10.2), a child of the
	// request's supervisor.dispatch span; "" means none.
	Span string
	// Cancellable operations only read (export writes only its destination,
	// through temp + rename), so they stop when their client disconnects;
	// every other one completes even then (§2.4: a command keeps running, a
	// publish still commits).
	Cancellable bool
}

// DisplayTitle is Title, else the ID with underscores as spaces and the
// first letter upper-cased.
func (op *Op) DisplayTitle() string {
	if op.Title != "" {
		return op.Title
	}
	t := strings.ReplaceAll(op.ID, "_", " ")
	if t == "" {
		return t
	}
	return strings.ToUpper(t[:1]) + t[1:]
}

// Hints are the MCP tool annotations of op, derived from its declaration.
type Hints struct {
	ReadOnly, Destructive, Idempotent, OpenWorld bool
}

// Hints derives the MCP annotations.
func (op *Op) Hints() Hints {
	ro := op.Effect == ReadOnly
	return Hints{
		ReadOnly:    ro,
		Destructive: op.Effect == Destructive || op.Effect == EffectUnknown,
		Idempotent:  ro || op.Idempotent,
		OpenWorld:   op.OpenWorld,
	}
}

// EffectText renders the declaration for help and docs.
func (op *Op) EffectText() string {
	h := op.Hints()
	s := op.Effect.String()
	if h.Idempotent && !h.ReadOnly {
		s += ", idempotent"
	}
	if h.OpenWorld {
		s += ", reaches outside the sandbox (network or host)"
	}
	return s
}

// Arg returns the named argument declaration, or nil.
func (op *Op) Arg(name string) *Arg {
	for i := range op.Args {
		if op.Args[i].Name == name {
			return &op.Args[i]
		}
	}
	return nil
}

// Family is a help heading; Capability families have no operations.
type Family struct {
	Group      Group
	Name       string
	Capability bool
	Help       string
}

func u64(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }
