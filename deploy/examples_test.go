package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/pathmend/pathmend/pkg/volume"
)

// provisionerAdds is what a storage system's controller adds to a
// StorageClass's parameters once it has created a volume, per transport:
// the identity of the new volume. The values are examples.
var provisionerAdds = map[string]map[string]string{
	"nvme-tcp": {"nqn": "nqn.2010-06.com.example:array1.pvc-0", "nguid": "0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
	"iscsi":    {"iqn": "iqn.2001-04.com.example:array2.pvc-0", "lun": "0"},
}

// loadExamples decodes every manifest under examples/.
func loadExamples(t *testing.T) []object {
	t.Helper()
	var objs []object
	for _, f := range manifestFiles(t) {
		if strings.HasPrefix(filepath.ToSlash(f), "examples/") {
			objs = append(objs, loadFile(t, f)...)
		}
	}
	if len(objs) == 0 {
		t.Fatal("no examples found")
	}
	return objs
}

// secretData is a Secret's data as kubelet hands it to NodeStageVolume:
// data decoded, stringData merged over it.
func secretData(s *corev1.Secret) map[string]string {
	m := map[string]string{}
	for k, v := range s.Data {
		m[k] = string(v)
	}
	for k, v := range s.StringData {
		m[k] = v
	}
	return m
}

// exampleSecret returns the example Secret namespace/name.
func exampleSecret(t *testing.T, objs []object, namespace, name string) *corev1.Secret {
	t.Helper()
	for _, s := range all[corev1.Secret](objs) {
		if s.Namespace == namespace && s.Name == name {
			return s
		}
	}
	t.Fatalf("no example Secret %s/%s", namespace, name)
	return nil
}

// TestExamples_VolumesPassTheVolumeContextParser stages each example PV
// on paper: its volumeAttributes and the Secret its nodeStageSecretRef
// names go through volume.Parse, the one parser NodeStageVolume uses.
func TestExamples_VolumesPassTheVolumeContextParser(t *testing.T) {
	objs := loadExamples(t)
	driver := loadInstall(t, "base").driver.Name
	transports := map[string]bool{}
	handles := map[string]string{}
	for _, pv := range all[corev1.PersistentVolume](objs) {
		csi := pv.Spec.CSI
		if csi == nil {
			t.Errorf("PV %s is not a CSI volume", pv.Name)
			continue
		}
		if csi.Driver != driver {
			t.Errorf("PV %s: driver %q, want %q", pv.Name, csi.Driver, driver)
		}
		if other, dup := handles[csi.VolumeHandle]; dup || csi.VolumeHandle == "" {
			t.Errorf("PV %s: volumeHandle %q is empty or also PV %s's", pv.Name, csi.VolumeHandle, other)
		}
		handles[csi.VolumeHandle] = pv.Name
		var secrets map[string]string
		if ref := csi.NodeStageSecretRef; ref != nil {
			secrets = secretData(exampleSecret(t, objs, ref.Namespace, ref.Name))
		}
		vc, _, err := volume.Parse(csi.VolumeAttributes, secrets)
		if err != nil {
			t.Errorf("PV %s: %v", pv.Name, err)
			continue
		}
		transports[string(vc.Transport)] = true
		checkFSType(t, "PV "+pv.Name, pv.Spec.VolumeMode, csi.FSType)
	}
	for _, want := range []string{"nvme-tcp", "iscsi"} {
		if !transports[want] {
			t.Errorf("no example PV of transport %s", want)
		}
	}
}

// checkFSType: a filesystem volume names a filesystem pathmend creates,
// a block volume none.
func checkFSType(t *testing.T, what string, mode *corev1.PersistentVolumeMode, fsType string) {
	t.Helper()
	if mode != nil && *mode == corev1.PersistentVolumeBlock {
		if fsType != "" {
			t.Errorf("%s: a block volume with fsType %q", what, fsType)
		}
		return
	}
	if !slices.Contains([]string{"", "ext4", "ext3", "xfs"}, fsType) {
		t.Errorf("%s: fsType %q; pathmend creates ext4, ext3 or xfs", what, fsType)
	}
}

// TestExamples_StorageClassParametersAreVolumeContext: the parameters a
// provisioner passes through, plus the volume identity it adds, pass
// volume.Parse with the node-stage secret the class names.
func TestExamples_StorageClassParametersAreVolumeContext(t *testing.T) {
	objs := loadExamples(t)
	driver := loadInstall(t, "base").driver.Name
	classes := all[storagev1.StorageClass](objs)
	if len(classes) == 0 {
		t.Fatal("no example StorageClass")
	}
	for _, sc := range classes {
		if sc.Provisioner != driver {
			t.Errorf("StorageClass %s: provisioner %q, want %q: the PVs it creates must name pathmend's driver", sc.Name, sc.Provisioner, driver)
		}
		vc := map[string]string{}
		for k, v := range sc.Parameters {
			// The external provisioner strips these before CreateVolume.
			if !strings.HasPrefix(k, volume.IgnoredKeyPrefix) {
				vc[k] = v
			}
		}
		adds, ok := provisionerAdds[vc["transport"]]
		if !ok {
			t.Errorf("StorageClass %s: transport %q", sc.Name, vc["transport"])
			continue
		}
		for k, v := range adds {
			if _, set := vc[k]; set {
				t.Errorf("StorageClass %s: parameter %s names one volume; the provisioner sets it per volume", sc.Name, k)
			}
			vc[k] = v
		}
		p := sc.Parameters
		name, ns := p["csi.storage.k8s.io/node-stage-secret-name"], p["csi.storage.k8s.io/node-stage-secret-namespace"]
		var secrets map[string]string
		if name != "" || ns != "" {
			secrets = secretData(exampleSecret(t, objs, ns, name))
		}
		if _, _, err := volume.Parse(vc, secrets); err != nil {
			t.Errorf("StorageClass %s: %v", sc.Name, err)
		}
		checkFSType(t, "StorageClass "+sc.Name, nil, p["csi.storage.k8s.io/fstype"])
	}
}

// TestExamples_SecretsAreUsed: every example Secret is some volume's
// node-stage secret, and holds only keys the parser takes from secrets.
func TestExamples_SecretsAreUsed(t *testing.T) {
	objs := loadExamples(t)
	used := map[string]bool{}
	for _, pv := range all[corev1.PersistentVolume](objs) {
		if ref := pv.Spec.CSI.NodeStageSecretRef; ref != nil {
			used[ref.Namespace+"/"+ref.Name] = true
		}
	}
	for _, sc := range all[storagev1.StorageClass](objs) {
		used[sc.Parameters["csi.storage.k8s.io/node-stage-secret-namespace"]+"/"+sc.Parameters["csi.storage.k8s.io/node-stage-secret-name"]] = true
	}
	secretKeys := map[string]bool{}
	for _, k := range volume.Keys() {
		if k.Secret {
			secretKeys[k.Key] = true
		}
	}
	for _, s := range all[corev1.Secret](objs) {
		if !used[s.Namespace+"/"+s.Name] {
			t.Errorf("Secret %s/%s is no volume's node-stage secret", s.Namespace, s.Name)
		}
		for k := range secretData(s) {
			if !secretKeys[k] {
				t.Errorf("Secret %s/%s: key %s is not a node-stage secret key", s.Namespace, s.Name, k)
			}
		}
	}
}

// TestExamples_ClaimBindsItsVolume: the example claim binds the static PV
// it names (and that PV is reserved for it), and the pod mounts the claim.
func TestExamples_ClaimBindsItsVolume(t *testing.T) {
	objs := loadExamples(t)
	pvs := map[string]*corev1.PersistentVolume{}
	for _, pv := range all[corev1.PersistentVolume](objs) {
		pvs[pv.Name] = pv
	}
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, c := range all[corev1.PersistentVolumeClaim](objs) {
		claims[c.Namespace+"/"+c.Name] = c
		pv, ok := pvs[c.Spec.VolumeName]
		if !ok {
			t.Errorf("PVC %s: volumeName %q is no example PV", c.Name, c.Spec.VolumeName)
			continue
		}
		if err := binds(c, pv); err != nil {
			t.Errorf("PVC %s does not bind PV %s: %v", c.Name, pv.Name, err)
		}
	}
	if len(claims) == 0 {
		t.Fatal("no example claim")
	}
	pods := all[corev1.Pod](objs)
	if len(pods) == 0 {
		t.Fatal("no example pod")
	}
	for _, pod := range pods {
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			if _, ok := claims[pod.Namespace+"/"+v.PersistentVolumeClaim.ClaimName]; !ok {
				t.Errorf("pod %s: claim %s is not an example claim in namespace %s", pod.Name, v.PersistentVolumeClaim.ClaimName, pod.Namespace)
			}
		}
	}
}

// binds reports why the PV controller would not bind claim c to pv.
func binds(c *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) error {
	if ref := pv.Spec.ClaimRef; ref != nil && (ref.Namespace != c.Namespace || ref.Name != c.Name) {
		return fmt.Errorf("the PV is reserved for %s/%s", ref.Namespace, ref.Name)
	}
	if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != pv.Spec.StorageClassName {
		return fmt.Errorf("storage class %v, PV's %q (a static PV wants \"\" on both)", c.Spec.StorageClassName, pv.Spec.StorageClassName)
	}
	for _, m := range c.Spec.AccessModes {
		if !slices.Contains(pv.Spec.AccessModes, m) {
			return fmt.Errorf("access mode %s not offered", m)
		}
	}
	cm, pm := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeFilesystem
	if c.Spec.VolumeMode != nil {
		cm = *c.Spec.VolumeMode
	}
	if pv.Spec.VolumeMode != nil {
		pm = *pv.Spec.VolumeMode
	}
	if cm != pm {
		return fmt.Errorf("volume mode %s, PV's %s", cm, pm)
	}
	req, capacity := c.Spec.Resources.Requests[corev1.ResourceStorage], pv.Spec.Capacity[corev1.ResourceStorage]
	if req.Cmp(capacity) > 0 {
		return fmt.Errorf("requests %s, PV holds %s", req.String(), capacity.String())
	}
	return nil
}
