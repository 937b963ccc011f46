// Package config owns config.yml (§13): the Config type with every
// default, loading with the contract's merge rule (objects merge, scalars
// and arrays replace, unknown keys refused) and validation that names the
// offending key. Field names are the ones the rest of the supervisor reads
// as cfg.Section.Key.
//
// It must never act on a configuration (create directories, open sockets,
// start anything) or import another supervisor package: it reads one file
// and judges it.
package config
