package qp

// sendQKey is the Q_Key a UD or GSI SEND carries in its DETH.
//
// QP1 sends GSIQKey whatever the WR names, as rxe's init_req_packet does
// (`qp_num == 1 ? GSI_QKEY : remote_qkey`): a GSI peer drops any other
// Q_Key (rxe's check_keys), so a WR naming one could only be lost.
//
// On UD a Q_Key with the high bit set asks for the QP's own Q_Key (IBA
// 10.2.5, controlled Q_Keys; mthca, mlx4 and hns do so). rxe sends the
// WR's value as it is: a deliberate difference (docs/DESIGN.md).
func (q *QP) sendQKey(wrQKey uint32) uint32 {
	switch {
	case q.typ == GSI:
		return GSIQKey
	case wrQKey&0x80000000 != 0:
		return q.attr.QKey
	default:
		return wrQKey
	}
}
