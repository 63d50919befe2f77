// Package buildinfo describes the running binary for the version output of
// both binaries: its module version, the VCS revision it was built from,
// whether the tree had uncommitted changes, and the Go version, all read
// from the build information the Go toolchain embeds.
package buildinfo

import "runtime/debug"

// Info is what the toolchain recorded about the running binary.
type Info struct {
	// Version is the main module's version: a tag for `go install
	// module@version`, "(devel)" for a build from a checkout.
	Version string
	// Revision is the VCS commit, "" when not built from a checkout.
	Revision string
	// Time is the commit time (RFC 3339), "" when unknown.
	Time string
	// Modified says the checkout had uncommitted changes.
	Modified bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns the build information of the running binary; fields stay
// empty when the binary carries none (e.g. a test binary).
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is the one-line version of the binary named name, e.g.
// "agentmesh v0.3.0 (commit 1a2b3c4d5e6f, 2026-11-20T10:00:00Z, modified) go1.25.1".
func (in Info) String(name string) string {
	s := name + " " + in.Version
	if in.Revision != "" {
		rev := in.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += " (commit " + rev
		if in.Time != "" {
			s += ", " + in.Time
		}
		if in.Modified {
			s += ", modified"
		}
		s += ")"
	}
	if in.GoVersion != "" {
		s += " " + in.GoVersion
	}
	return s
}

// Line is Read().String(name).
func Line(name string) string { return Read().String(name) }
