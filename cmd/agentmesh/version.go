package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/cmd/internal/buildinfo"
)

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Long: `version prints the module version (a tag, or "(devel)" for a build from a
checkout), the commit it was built from and whether the checkout had
uncommitted changes, and the Go version, as the Go toolchain recorded them.
agentmesh --version prints the same.`,
		Args: cobra.NoArgs,
		// No configuration is needed, so an invalid one does not hide the version.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintln(a.stdout, buildinfo.Line("agentmesh"))
			return err
		},
	}
}
