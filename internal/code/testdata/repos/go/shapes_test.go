package shapes

import "testing"

func TestArea(t *testing.T) {
	if got := (Rect{W: 3, H: 4}).Area(); got != 12 {
		t.Fatalf("Area = %d, want 12", got)
	}
}

func TestPerimeter(t *testing.T) {
	if got := (Rect{W: 3, H: 4}).Perimeter(); got != 14 {
		t.Fatalf("Perimeter = %d, want 14", got)
	}
}
