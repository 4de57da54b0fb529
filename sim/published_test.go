package sim

import "testing"

// The simulator reproduces the artifact's published per-seed curve for a
// deterministic policy point for point (fast enough for the normal suite;
// the full check is TestReproExactCurves under the simrepro tag).
func TestPublishedCurveBestFitSeed42(t *testing.T) {
	tr := loadTraceTB(t, "default")
	want := findPublished(publishedTB(t), "openb_pod_list_default", "bestfit", 42)
	if want == nil {
		t.Fatal("no published bestfit curve for seed 42")
	}
	res, err := Run(tr, Config{Policy: "bestfit", Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if n, d := curveDiff(t, res.Curve, want); n != 0 {
		t.Errorf("%d of %d points differ from the published curve (max %.2f)", n, len(res.Curve), d)
	}
	if res.Pods != 10866 {
		t.Errorf("seed 42 has %d arriving pods, want 10866 (8152 shuffled + sampled to 1.3x)", res.Pods)
	}
}
