// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// The contract document, proto/bridge/README.md, is what gputally's server is written from;
// these tests hold the client to its tables (the Python side holds the .proto to them).
var contractReadme = filepath.Join("..", "..", "proto", "bridge", "README.md")

// tableRows is the body rows of the first table under "## heading", cells without backticks.
func tableRows(t *testing.T, heading string) [][]string {
	t.Helper()
	text, err := os.ReadFile(contractReadme)
	require.NoError(t, err)
	_, section, found := strings.Cut(string(text), "\n## "+heading+"\n")
	require.True(t, found, "no section %q in %s", heading, contractReadme)
	section, _, _ = strings.Cut(section, "\n## ")
	var rows [][]string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		var cells []string
		for _, cell := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.Trim(strings.TrimSpace(cell), "`"))
		}
		rows = append(rows, cells)
	}
	require.Greater(t, len(rows), 2, "no table under %q", heading)
	return rows[2:] // after the header and its |---| line
}

func TestMethodPathsMatchTheContract(t *testing.T) {
	var documented []string
	for _, row := range tableRows(t, "Methods") {
		documented = append(documented, row[0])
	}
	assert.ElementsMatch(t, documented, []string{
		bridgepb.Bridge_ProcessMetrics_FullMethodName,
		bridgepb.Bridge_ProcessLogs_FullMethodName,
		bridgepb.Bridge_ProcessTraces_FullMethodName,
	})
	assert.Equal(t, "/"+bridgepb.Bridge_ServiceDesc.ServiceName+"/"+metricsCodec.method, bridgepb.Bridge_ProcessMetrics_FullMethodName)
	assert.Equal(t, "/"+bridgepb.Bridge_ServiceDesc.ServiceName+"/"+logsCodec.method, bridgepb.Bridge_ProcessLogs_FullMethodName)
	assert.Equal(t, "/"+bridgepb.Bridge_ServiceDesc.ServiceName+"/"+tracesCodec.method, bridgepb.Bridge_ProcessTraces_FullMethodName)
}

// codeNamed is the gRPC code of a canonical name such as "NOT_FOUND", as the README writes them.
func codeNamed(t *testing.T, name string) codes.Code {
	t.Helper()
	var c codes.Code
	require.NoError(t, c.UnmarshalJSON([]byte(`"`+name+`"`)), "README names an unknown code %q", name)
	return c
}

func TestRetryDecisionsMatchTheContract(t *testing.T) {
	rows := tableRows(t, "Status codes")
	documented := map[codes.Code]bool{}
	for _, row := range rows {
		name, when, want := row[0], row[1], row[2]
		code := codeNamed(t, name)
		documented[code] = true
		st := status.New(code, "from the test")
		if strings.Contains(when, "with `google.rpc.RetryInfo`") {
			var err error
			st, err = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
			require.NoError(t, err)
		}
		require.Contains(t, []string{"permanent", "transient"}, want, name)
		assert.Equal(t, want == "transient", retryable(st), "%s (%s)", name, when)
	}
	// "Any other code is treated as permanent."
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		if !documented[code] {
			assert.False(t, retryable(status.New(code, "")), "%v is not in the table, so permanent", code)
		}
	}
}
