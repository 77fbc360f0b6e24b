// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"
)

func TestFactory(t *testing.T) {
	f := NewFactory()
	assert.Equal(t, "gputally", f.Type().String())
	assert.Equal(t, component.StabilityLevelAlpha, f.MetricsStability())
	assert.Equal(t, component.StabilityLevelAlpha, f.LogsStability())
	assert.Equal(t, component.StabilityLevelAlpha, f.TracesStability())
}

// create makes the processor of one signal from the factory.
func create(t *testing.T, signal string, cfg component.Config) component.Component {
	t.Helper()
	f, set, ctx := NewFactory(), processortest.NewNopSettings(componentType), context.Background()
	var proc component.Component
	var err error
	switch signal {
	case "metrics":
		var p processor.Metrics
		p, err = f.CreateMetrics(ctx, set, cfg, consumertest.NewNop())
		if err == nil {
			assert.Equal(t, cfg.(*Config).AcceptPatch, p.Capabilities().MutatesData,
				"a patch changes the batch in place; a whole-batch answer is a new batch")
		}
		proc = p
	case "logs":
		proc, err = f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	case "traces":
		proc, err = f.CreateTraces(ctx, set, cfg, consumertest.NewNop())
	}
	require.NoError(t, err)
	return proc
}

func TestLifecycle(t *testing.T) {
	for _, signal := range signals {
		t.Run(signal, func(t *testing.T) {
			ctx := context.Background()
			// Nothing listens there: start does not wait for a connection.
			proc := create(t, signal, testConfig(closedAddress(t)))
			require.NoError(t, proc.Shutdown(ctx), "shutdown before start")
			require.NoError(t, proc.Start(ctx, componenttest.NewNopHost()))
			require.NoError(t, proc.Shutdown(ctx))
			require.NoError(t, proc.Shutdown(ctx), "second shutdown")
		})
	}
}

func TestStartFailsOnBadTLSFiles(t *testing.T) {
	cfg := testConfig("localhost:4320")
	cfg.ClientConfig.TLS.Insecure = false
	cfg.ClientConfig.TLS.CAFile = "testdata/no-such-ca.pem"
	proc := create(t, "metrics", cfg)
	err := proc.Start(context.Background(), componenttest.NewNopHost())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no-such-ca.pem")
	require.NoError(t, proc.Shutdown(context.Background()))
}
