package install

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// PluginSchedulerConfigFile is tessera-scheduler's KubeSchedulerConfiguration
// in the repository: kube-scheduler with Tessera's plugin (scheduler/).
const PluginSchedulerConfigFile = "deploy/scheduler/scheduler-config.yaml"

// PluginSchedulerConfig writes to dst deploy/scheduler/scheduler-config.yaml
// with flags as the args of the Tessera plugin (pluginConfig name Tessera,
// args.flags: the flags of the extender that runs in the scheduler's
// process) in every profile that configures it; every profile must give
// the same flags, so all get these. Nothing else changes. It fails when no
// profile configures the plugin.
func PluginSchedulerConfig(repoRoot, dst string, flags []string) error {
	rel := PluginSchedulerConfigFile
	raw, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		return fmt.Errorf("read %s: %w", rel, err)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	profiles, _ := cfg["profiles"].([]any)
	set := 0
	for _, p := range profiles {
		prof, _ := p.(map[string]any)
		pcs, _ := prof["pluginConfig"].([]any)
		for _, pc := range pcs {
			if m, _ := pc.(map[string]any); m != nil && m["name"] == "Tessera" {
				m["args"] = map[string]any{"flags": append([]string(nil), flags...)}
				set++
			}
		}
	}
	if set == 0 {
		return errors.New(rel + " configures no Tessera plugin (pluginConfig name Tessera)")
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("marshal plugin scheduler config: %w", err)
	}
	if err := os.WriteFile(dst, out, 0o600); err != nil {
		return fmt.Errorf("write plugin scheduler config: %w", err)
	}
	return nil
}
