package supervisor

import (
	"encoding/json"
	"reflect"
	"testing"
)

// traceFile keeps file_blame's tiling: one conversation per owner key, in
// order of first appearance, whose ranges together tile the file once.
func TestTraceFile(t *testing.T) {
	alice := lineOwner{Owner: "workspace_session:ws-a", CommandSessionID: "cmd-1", Agent: "alice", LayerID: "L000002-aaaaaaaa", TS: "t"}
	op := lineOwner{Owner: "operation:req-1", LayerID: "L000003-bbbbbbbb", TS: "t"}
	orig := lineOwner{Owner: ownerOriginal}
	for _, tc := range []struct {
		name   string
		owners []lineOwner
		want   map[string][][2]int // contributor type|owner → ranges
		order  []string
	}{
		{"empty", nil, map[string][][2]int{}, nil},
		{"one owner", []lineOwner{orig, orig}, map[string][][2]int{"human|original": {{1, 2}}}, []string{"human|original"}},
		{"interleaved", []lineOwner{orig, alice, alice, orig, op, alice},
			map[string][][2]int{"human|original": {{1, 1}, {4, 4}}, "ai|workspace_session:ws-a": {{2, 3}, {6, 6}}, "unknown|operation:req-1": {{5, 5}}},
			[]string{"human|original", "ai|workspace_session:ws-a", "unknown|operation:req-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := traceFile("p.txt", tc.owners, nil, false)
			got := map[string][][2]int{}
			var order []string
			for _, c := range f.Conversations {
				k := c.Contributor["type"] + "|" + c.Metadata["owner"].(string)
				order = append(order, k)
				for _, r := range c.Ranges {
					got[k] = append(got[k], [2]int{r.StartLine, r.EndLine})
				}
			}
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(order, tc.order) {
				t.Errorf("got %v in order %v, want %v in order %v", got, order, tc.want, tc.order)
			}
		})
	}
	// The session's conversation names its session, command and layer.
	f := traceFile("p.txt", []lineOwner{alice}, []string{"x"}, false)
	b, _ := json.Marshal(f.Conversations[0].Metadata)
	if string(b) != `{"agent":"alice","command_session_id":"cmd-1","layer_id":"L000002-aaaaaaaa","owner":"workspace_session:ws-a","workspace_session_id":"ws-a"}` {
		t.Errorf("metadata: %s", b)
	}
	if f.Conversations[0].Ranges[0].ContentHash != contentDigest([]byte("x")) {
		t.Errorf("content hash: %v", f.Conversations[0].Ranges[0])
	}
}
