package volume

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const docPath = "../../docs/volume-context.md"

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("read the volume context documentation: %v", err)
	}
	return string(b)
}

// docRows returns the rows of the key table in docs/volume-context.md,
// keyed by key, as trimmed cells.
func docRows(t *testing.T, doc string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		key := strings.Trim(cells[0], "`")
		if _, dup := rows[key]; dup {
			t.Errorf("key %q has two rows in the documentation", key)
		}
		rows[key] = cells
	}
	return rows
}

// TestDocs_ListEveryKey keeps docs/volume-context.md and the key table in
// step: every key has a row whose transport, required and secret columns
// match Keys, and the documentation lists no key the parser does not know.
func TestDocs_ListEveryKey(t *testing.T) {
	doc := readDoc(t)
	rows := docRows(t, doc)
	yesNo := map[bool]string{true: "yes", false: "no"}
	for _, d := range Keys() {
		row, ok := rows[d.Key]
		if !ok {
			t.Errorf("key %q has no row in %s", d.Key, docPath)
			continue
		}
		if len(row) != 7 {
			t.Errorf("row of %q has %d cells, want 7: %q", d.Key, len(row), row)
			continue
		}
		tr := string(d.Transport)
		if d.Transport == anyTransport {
			tr = "all"
		}
		want := []string{tr, yesNo[d.Required], yesNo[d.Secret]}
		if diff := cmp.Diff(want, row[1:4]); diff != "" {
			t.Errorf("row of %q: transport/required/secret (-code +docs):\n%s", d.Key, diff)
		}
		delete(rows, d.Key)
	}
	for key := range rows {
		t.Errorf("%s documents key %q, which the parser does not accept", docPath, key)
	}
	if !strings.Contains(doc, "`"+IgnoredKeyPrefix+"`") {
		t.Errorf("%s does not explain the ignored %s prefix", docPath, IgnoredKeyPrefix)
	}
}

// TestDocs_ExamplesParse parses every YAML example that carries
// volumeAttributes, together with the stringData of the Secret in the same
// block, so an example in the documentation cannot be invalid.
func TestDocs_ExamplesParse(t *testing.T) {
	blocks := yamlBlocks(readDoc(t))
	seen := map[Transport]bool{}
	for i, b := range blocks {
		vc := yamlMap(b, "volumeAttributes:")
		if vc == nil {
			continue
		}
		secrets := yamlMap(b, "stringData:")
		// A VolumeAttachment's attachmentMetadata is the publish context.
		pc := yamlMap(b, "attachmentMetadata:")
		c, s, err := ParseWithPublish(vc, pc, secrets)
		if err != nil {
			t.Errorf("example %d does not parse: %v", i+1, err)
			continue
		}
		if len(secrets) > 0 && s == (Secrets{}) {
			t.Errorf("example %d: secrets were not read", i+1)
		}
		seen[c.Transport] = true
	}
	for _, tr := range Transports {
		if !seen[tr] {
			t.Errorf("%s has no parsing example for transport %s", docPath, tr)
		}
	}
}

// yamlBlocks returns the bodies of the ```yaml fences of a markdown text.
func yamlBlocks(doc string) []string {
	var blocks []string
	for _, part := range strings.Split(doc, "```yaml\n")[1:] {
		body, _, _ := strings.Cut(part, "```")
		blocks = append(blocks, body)
	}
	return blocks
}

// yamlMap reads the flat string map under the line ending in header: every
// following line indented deeper than the header, as "key: value" with the
// value optionally double-quoted. It understands exactly the subset the
// examples use, and returns nil when header is absent.
func yamlMap(block, header string) map[string]string {
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != header {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " "))
		m := map[string]string{}
		for _, kv := range lines[i+1:] {
			if len(kv)-len(strings.TrimLeft(kv, " ")) <= indent || strings.TrimSpace(kv) == "" {
				break
			}
			k, v, _ := strings.Cut(strings.TrimSpace(kv), ": ")
			if uq, err := strconv.Unquote(v); err == nil {
				v = uq
			}
			m[k] = v
		}
		return m
	}
	return nil
}

func TestKeys_TableIsConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range Keys() {
		if seen[d.Key] {
			t.Errorf("key %q appears twice", d.Key)
		}
		seen[d.Key] = true
		if d.Format == "" || d.Description == "" {
			t.Errorf("key %q lacks a format or a description", d.Key)
		}
		if d.Required && d.Default != "" {
			t.Errorf("required key %q has a default %q", d.Key, d.Default)
		}
		if !d.Required && d.Default == "" && d.Key != keyNSID && d.Key != keyNGUID && d.Key != keyUUID {
			t.Errorf("optional key %q does not say what its absence means", d.Key)
		}
		if d.Secret && d.Transport == anyTransport {
			t.Errorf("secret key %q has no transport", d.Key)
		}
		if strings.HasPrefix(d.Key, IgnoredKeyPrefix) {
			t.Errorf("key %q would be ignored by its prefix", d.Key)
		}
	}
	// Keys returns a copy: changing it cannot change parsing.
	k := Keys()
	k[0].Key = "changed"
	if Keys()[0].Key == "changed" {
		t.Error("Keys returns the parser's own table")
	}
}

func TestSuggest(t *testing.T) {
	known := knownKeys(TransportNVMeTCP, false)
	tests := map[string]string{
		"endpoint":        "endpoints",
		"NQN":             "nqn",
		"ctrlLosTmo":      "ctrlLossTmo",
		"ctrl_loss_tmo":   "ctrlLossTmo",
		"lossTimeout":     "", // too far: the list in the message helps instead
		"portals":         "",
		"optimizedEndpts": "",
	}
	for in, want := range tests {
		if got := suggest(in, known); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}
