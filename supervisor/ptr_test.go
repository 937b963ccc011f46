package supervisor

// ptr was config.go's; the tests here that build optional fields still
// need it now that the configuration has its own package.
func ptr[T any](v T) *T { return &v }
