// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
)

// loadConfig unmarshals the testdata entry `id` over the default config, as the Collector does.
func loadConfig(t *testing.T, id string) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	sub, err := cm.Sub("gputally" + id)
	require.NoError(t, err)
	cfg := NewFactory().CreateDefaultConfig()
	if err := sub.Unmarshal(cfg); err != nil {
		return nil, err
	}
	return cfg.(*Config), nil
}

func TestConfigStruct(t *testing.T) {
	require.NoError(t, componenttest.CheckConfigStruct(NewFactory().CreateDefaultConfig()))
}

func TestDefaultConfig(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	assert.Equal(t, 5*time.Second, cfg.Timeout)
	assert.Equal(t, OnErrorPass, cfg.OnError)
	assert.Equal(t, 64, cfg.MaxMessageSizeMiB)
	assert.True(t, cfg.AcceptPatch)
	assert.Equal(t, 1, cfg.Connections)
	// Only what has no default is missing.
	err := confmap.Validate(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "endpoint: required")
	assert.Contains(t, err.Error(), "pipeline: required")
	assert.NotContains(t, err.Error(), "timeout")
	assert.NotContains(t, err.Error(), "on_error")
}

func TestLoadMinimalConfig(t *testing.T) {
	cfg, err := loadConfig(t, "")
	require.NoError(t, err)
	require.NoError(t, confmap.Validate(cfg))
	want := createDefaultConfig().(*Config)
	want.ClientConfig.Endpoint = "localhost:4320"
	want.Pipeline = "metrics/bridge"
	assert.Equal(t, want, cfg)
}

func TestLoadFullConfig(t *testing.T) {
	cfg, err := loadConfig(t, "/full")
	require.NoError(t, err)
	require.NoError(t, confmap.Validate(cfg))
	assert.Equal(t, "dns:///gputally.gputally-system.svc:4320", cfg.ClientConfig.Endpoint)
	assert.Equal(t, "metrics/bridge", cfg.Pipeline)
	assert.Equal(t, 2*time.Second, cfg.Timeout)
	assert.Equal(t, OnErrorFail, cfg.OnError)
	assert.Equal(t, 16, cfg.MaxMessageSizeMiB)
	assert.False(t, cfg.AcceptPatch)
	assert.Equal(t, 4, cfg.Connections)
	assert.Equal(t, 16<<20, cfg.maxMessageBytes())
	assert.EqualValues(t, "gzip", cfg.ClientConfig.Compression)
	assert.Equal(t, "round_robin", cfg.ClientConfig.BalancerName)
	assert.Equal(t, configopaque.MapList{{Name: "x-tenant", Value: "team-a"}}, cfg.ClientConfig.Headers)
	assert.True(t, cfg.ClientConfig.TLS.Insecure)
	require.True(t, cfg.ClientConfig.Keepalive.HasValue())
	assert.Equal(t, 30*time.Second, cfg.ClientConfig.Keepalive.Get().Time)
	assert.Equal(t, 5*time.Second, cfg.ClientConfig.Keepalive.Get().Timeout)
}

func TestUnknownKeyIsRefused(t *testing.T) {
	_, err := loadConfig(t, "/typo")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "pipline")
}

func TestValidateReportsEveryProblem(t *testing.T) {
	cfg, err := loadConfig(t, "/invalid")
	require.NoError(t, err)
	err = confmap.Validate(cfg)
	require.Error(t, err)
	for _, want := range []string{
		"endpoint: required",
		"pipeline: required",
		"timeout: must be positive, got 0s",
		`on_error: must be pass, drop or fail, got "retry"`,
		"max_message_size_mib: must be 1 to 2047, got 0",
		"invalid balancer_name: no_such_balancer", // configgrpc's own check still runs
	} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestValidateBounds(t *testing.T) {
	cfg := testConfig("localhost:4320")
	require.NoError(t, cfg.Validate())
	cfg.MaxMessageSizeMiB = 2048
	assert.ErrorContains(t, cfg.Validate(), "max_message_size_mib")
	cfg.MaxMessageSizeMiB = 2047
	cfg.Timeout = -time.Second
	assert.ErrorContains(t, cfg.Validate(), "timeout: must be positive")
	cfg.Timeout = time.Second
	cfg.Connections = 17
	assert.ErrorContains(t, cfg.Validate(), "connections: must be 1 to 16, got 17")
	cfg.Connections = 0
	assert.ErrorContains(t, cfg.Validate(), "connections: must be 1 to 16, got 0")
}
