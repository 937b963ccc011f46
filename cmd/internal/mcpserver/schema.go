package mcpserver

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Tool is the MCP tool of op: name, title, description, input schema and
// the annotations its catalog declaration implies.
func Tool(op *catalog.Op, opts Options) mcp.Tool {
	t := mcp.NewToolWithRawSchema(op.ID, Description(op), InputSchema(op, opts))
	t.RawOutputSchema = OutputSchema(op)
	h := op.Hints()
	t.Title = op.DisplayTitle()
	t.Annotations = mcp.ToolAnnotation{
		Title:           op.DisplayTitle(),
		ReadOnlyHint:    mcp.ToBoolPtr(h.ReadOnly),
		DestructiveHint: mcp.ToBoolPtr(h.Destructive),
		IdempotentHint:  mcp.ToBoolPtr(h.Idempotent),
		OpenWorldHint:   mcp.ToBoolPtr(h.OpenWorld),
	}
	return t
}

// OutputSchema is the tool output schema of op, nil when the catalog
// declares no exact result. Clients that check it (the MCP TypeScript SDK)
// validate every structuredContent, error results included, and an error
// carries the contract's envelope there (§3.1); so the schema is the
// declared result or the envelope.
func OutputSchema(op *catalog.Op) json.RawMessage {
	if op.Output == nil {
		return nil
	}
	envelope := map[string]any{"type": "object", "required": []string{"error"}, "additionalProperties": true,
		"properties": map[string]any{"error": map[string]any{"type": "object", "required": []string{"kind", "message", "details"},
			"additionalProperties": true, "properties": map[string]any{
				"kind": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"}, "details": map[string]any{"type": "object"}}}}}
	return catalog.CompactJSON(map[string]any{"type": "object", "anyOf": []any{op.Output(), envelope}})
}

// Description is a tool's description: summary, help, result and, for
// command outputs, how the result text is laid out.
func Description(op *catalog.Op) string {
	parts := []string{op.Summary}
	if op.Help != "" {
		parts = append(parts, op.Help)
	}
	if op.Result != "" {
		parts = append(parts, "Result: "+op.Result)
	}
	if isCommandOutput(op) {
		parts = append(parts, "Result text: the first line is the command output object as JSON without output; "+
			"the lines after it are the output, terminal escapes stripped, bounded by max_output_tokens "+
			"(output_truncated then names the omitted row offsets).")
	}
	return strings.Join(parts, "\n\n")
}

// property is one input-schema property; field order is the output order.
type property struct {
	Type                 string               `json:"type"`
	Description          string               `json:"description,omitempty"`
	Enum                 []string             `json:"enum,omitempty"`
	Minimum              *float64             `json:"minimum,omitempty"`
	Maximum              *float64             `json:"maximum,omitempty"`
	MaxLength            int                  `json:"maxLength,omitempty"`
	Items                any                  `json:"items,omitempty"`
	MaxItems             int                  `json:"maxItems,omitempty"`
	Properties           map[string]*property `json:"properties,omitempty"`
	Required             []string             `json:"required,omitempty"`
	AdditionalProperties *bool                `json:"additionalProperties,omitempty"`
	Default              any                  `json:"default,omitempty"`
}

// itemsSchema is an array's items: a plain type or an object.
type itemsSchema = property

// itemSchema renders a catalog Items declaration.
func itemSchema(it *catalog.Items) any {
	if it == nil {
		// The catalog test requires items on every array; should one slip
		// through, an empty schema is still present (clients refuse none)
		// and refuses nothing the catalog accepts.
		return map[string]any{}
	}
	if len(it.Fields) == 0 {
		return &itemsSchema{Type: "string"}
	}
	no := false
	s := &itemsSchema{Type: "object", Properties: map[string]*property{}, Required: []string{}, AdditionalProperties: &no}
	for _, f := range it.Fields {
		fp := &property{Description: f.Help, Enum: f.Enum, Default: f.Default}
		switch f.Kind {
		case catalog.Integer:
			fp.Type, fp.Minimum = "integer", new(float64)
		case catalog.Float:
			fp.Type = "number"
		case catalog.Boolean:
			fp.Type = "boolean"
		default:
			fp.Type = "string"
		}
		s.Properties[f.Name] = fp
		if f.Required {
			s.Required = append(s.Required, f.Name)
		}
	}
	return s
}

// InputSchema renders the tool input schema of op (§3.1, §2.6, A2),
// properties in catalog order. Limits the catalog clamps are left out so
// that mcp-go's validation never refuses what the catalog accepts.
func InputSchema(op *catalog.Op, opts Options) json.RawMessage {
	var b bytes.Buffer
	b.WriteString(`{"type":"object","properties":{`)
	var required []string
	n := 0
	add := func(name string, p property) {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		k, _ := json.Marshal(name)
		b.Write(k)
		b.WriteByte(':')
		b.Write(catalog.CompactJSON(p))
	}
	if op.Group == catalog.Runtime {
		if opts.SandboxID != "" {
			add("sandbox_id", property{Type: "string", Description: "The sandbox to operate in (sent in the request scope). Default: " + opts.SandboxID + "."})
		} else {
			add("sandbox_id", property{Type: "string", Description: "The sandbox to operate in (sent in the request scope); list_sandboxes shows them."})
			required = append(required, "sandbox_id")
		}
	}
	for i := range op.Args {
		a := &op.Args[i]
		p := property{Description: a.Help, Default: a.Default}
		if a.DefaultDoc != "" {
			p.Description = strings.TrimSpace(p.Description + " Default: " + a.DefaultDoc + ".")
		}
		switch a.Kind {
		case catalog.String, catalog.Path:
			p.Type, p.Enum, p.MaxLength = "string", a.Enum, a.MaxLen
		case catalog.Integer:
			p.Type = "integer"
			lo := 0.0
			if a.Min != nil && !a.ClampMin {
				lo = float64(*a.Min)
			}
			p.Minimum = &lo
			if a.Max != nil && !a.ClampMax {
				hi := float64(*a.Max)
				p.Maximum = &hi
			}
		case catalog.Float:
			p.Type, p.Minimum, p.Maximum = "number", a.FMin, a.FMax
		case catalog.Boolean:
			p.Type = "boolean"
		case catalog.JSONArray:
			p.Type, p.MaxItems, p.Items = "array", a.MaxItems, itemSchema(a.Items)
		}
		if op.ID == "create_sandbox" && a.Name == "workspace_root" && opts.Cwd != "" {
			p.Description += " A relative path is taken from the MCP server's working directory (" + opts.Cwd + ")."
		}
		add(a.Name, p)
		if a.Required {
			required = append(required, a.Name)
		}
	}
	if required == nil {
		required = []string{}
	}
	b.WriteString(`},"required":`)
	b.Write(catalog.CompactJSON(required))
	b.WriteString(`,"additionalProperties":false}`)
	return json.RawMessage(b.Bytes())
}
