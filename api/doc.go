// Package api is the one place where Tessera declares the names it shares with
// Kubernetes and with the workloads it serves: extended resource names,
// annotations, labels, environment variables, and the versioned file formats
// (configuration, mock machine profiles).
//
// Every other package refers to these declarations; no component spells a key
// as a string literal of its own.
package api
