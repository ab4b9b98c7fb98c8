//go:build tools

// Package servers pins the upstream Alertmanager release FlopWatch's tests run against; the
// setup script builds its binaries from this module (scripts/build-servers.sh).
package servers

import (
	_ "github.com/prometheus/alertmanager/cmd/alertmanager"
	_ "github.com/prometheus/alertmanager/cmd/amtool"
)
