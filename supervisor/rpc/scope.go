package rpc

import "github.com/ephemeral-ai-lab/sandbox/catalog"

// NormalizeScope applies §2.3's sandbox_id placement rules and §2.4 step 6.
func NormalizeScope(op *catalog.Op, req *catalog.Request) *catalog.Error {
	if op.Group != catalog.Management {
		if v, present := req.Args["sandbox_id"]; present && v != nil {
			id, ok := v.(string)
			if !ok {
				return catalog.Errorf(catalog.InvalidRequest, "sandbox_id must be a string")
			}
			if req.Scope.Kind == "sandbox" && req.Scope.SandboxID != id {
				return catalog.Errorf(catalog.InvalidRequest, "sandbox_id in args does not match scope")
			}
			if req.Scope.Kind == "system" && op.Scope != catalog.ScopeSystem {
				req.Scope = catalog.RequestScope{Kind: "sandbox", SandboxID: id}
			}
			if op.Arg("sandbox_id") == nil {
				delete(req.Args, "sandbox_id")
			}
		}
	}
	switch {
	case op.Scope == catalog.ScopeSandbox && req.Scope.Kind != "sandbox":
		return catalog.Errorf(catalog.InvalidRequest, "operation %s requires sandbox scope", op.ID)
	case op.Scope == catalog.ScopeSystem && req.Scope.Kind != "system":
		return catalog.Errorf(catalog.InvalidRequest, "operation %s requires system scope", op.ID)
	}
	return nil
}
