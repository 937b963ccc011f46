// Package upperfmtcases owns the upper-format conformance table
// (testdata/cases.json) and builds its cases on disk for the tests of the
// two readers of the format: layers (layers/upperfmt.go) and its fd-based
// twin in fuseoverlay, which may not import layers. It must never be
// imported by non-test code, and never import another package of this
// module.
package upperfmtcases
