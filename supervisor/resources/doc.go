// Package resources owns resource measurement (contract §10.2, §10.3): the
// delegated cgroup v2 subtree (one cgroup per sandbox, one leaf per
// workspace session), the /proc readers that stand in without delegation,
// the sample records and their store appends, the sampler loop, and the
// series (with counter deltas) the resources, cgroup, snapshot and
// layerstack views read back.
//
// It must never take a sample on demand for a query, nor write outside the
// supervisor's own cgroup subtree and its resource stores.
package resources
